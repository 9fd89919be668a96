//! What the commands need from the system, and installing it with apt-get.

use std::process::Command;

/// Something a command needs: how to tell it is there, and the Debian package that brings it.
pub(crate) struct Need {
    what: &'static str,
    why: &'static str,
    package: &'static str,
    present: fn() -> bool,
}

pub(crate) fn runs(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .output()
        .is_ok_and(|out| out.status.success())
}

fn redis_server() -> bool {
    let binary = std::env::var("DLOCK_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    runs(&binary, "--version")
}

fn chromium() -> bool {
    runs("chromium", "--version")
}

fn chromedriver() -> bool {
    runs("chromedriver", "--version")
}

fn postgresql() -> bool {
    std::fs::read_dir("/usr/lib/postgresql").is_ok_and(|versions| {
        versions
            .flatten()
            .any(|v| v.path().join("bin").join("initdb").exists())
    })
}

pub(crate) const REDIS: Need = Need {
    what: "redis-server",
    why: "every lock lives in Redis; the demo and the tests start private servers on free ports",
    package: "redis-server",
    present: redis_server,
};

pub(crate) const TEST_NEEDS: [Need; 4] = [
    REDIS,
    Need {
        what: "chromium",
        why: "the flash-sale browser test drives the shop's page in headless Chromium",
        package: "chromium",
        present: chromium,
    },
    Need {
        what: "chromedriver",
        why: "the browser test talks to Chromium through its driver",
        package: "chromium-driver",
        present: chromedriver,
    },
    POSTGRES,
];

pub(crate) const POSTGRES: Need = Need {
    what: "PostgreSQL",
    why: "the tests on PostgreSQL and `demo --locks postgres` start a throwaway cluster with \
          initdb",
    package: "postgresql",
    present: postgresql,
};

/// Installs whatever of `needs` is missing, or says how to.
pub(crate) fn ensure(needs: &[Need]) -> Result<(), String> {
    let missing: Vec<&Need> = needs.iter().filter(|n| !(n.present)()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let packages: Vec<&str> = missing.iter().map(|n| n.package).collect();
    for need in &missing {
        println!("xtask: {} is missing: {}", need.what, need.why);
    }
    let apt = runs("apt-get", "--version");
    if !apt {
        return Err(format!(
            "install {} with your system's package manager (Debian/Ubuntu: \
             `apt-get install {}`), then run this again",
            missing
                .iter()
                .map(|n| n.what)
                .collect::<Vec<_>>()
                .join(", "),
            packages.join(" ")
        ));
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0");
    let sudo = !root && runs("sudo", "--version");
    if !root && !sudo {
        return Err(format!(
            "installing needs root: run `apt-get install {}` as root, then this again",
            packages.join(" ")
        ));
    }
    println!("xtask: installing {} with apt-get", packages.join(" "));
    let apt_get = |args: &[&str]| -> Result<(), String> {
        let mut cmd = if sudo {
            let mut c = Command::new("sudo");
            c.arg("apt-get");
            c
        } else {
            Command::new("apt-get")
        };
        let status = cmd
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(|e| format!("cannot run apt-get: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("`apt-get {}` failed ({status})", args.join(" ")))
        }
    };
    apt_get(&["update", "-qq"])?;
    let mut install = vec!["install", "-y", "-qq"];
    install.extend(&packages);
    apt_get(&install)?;
    // The packages start system services; the demo and the tests start servers of their own.
    for service in ["redis-server", "postgresql"] {
        if packages.iter().any(|p| p.starts_with(service)) {
            let mut stop = if sudo {
                let mut c = Command::new("sudo");
                c.arg("service");
                c
            } else {
                Command::new("service")
            };
            let _ = stop.args([service, "stop"]).output();
        }
    }
    let still: Vec<&str> = missing
        .iter()
        .filter(|n| !(n.present)())
        .map(|n| n.what)
        .collect();
    if still.is_empty() {
        Ok(())
    } else {
        Err(format!("still missing after apt-get: {}", still.join(", ")))
    }
}
