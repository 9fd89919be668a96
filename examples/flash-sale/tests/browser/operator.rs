//! The operator's plots under load: three instances, the load generator against them, the
//! operator's view drawing every instance's seconds; then one instance dies (its line stops,
//! the legend says it is unreachable, the others go on) and comes back (its line resumes after
//! a gap).
//!
//! With `UPDATE_SCREENSHOTS=1` the load runs for a minute and a half before the first picture,
//! so that the plots in `docs/09-operator.png` and `docs/13-operator-instance-down.png` show
//! more than a few seconds; otherwise a few seconds of load are enough to check the drawing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flash_sale::auth::OperatorToken;
use flash_sale::loadgen::{self, LoadConfig};
use serde_json::{Value, json};

use super::{OPERATOR, PATIENCE, Page, Shop, screenshot_dir, with_browser};

/// The panels of the operator's view, by the id of their SVG.
const PANELS: [&str; 6] = [
    "purchases",
    "checkouts",
    "conflicts",
    "wait",
    "handovers",
    "stale",
];

/// What the page drew: per panel, its lines (instance, points, segments, how far the line
/// rises in pixels) and its axis labels; the legend's entries.
const DRAWN: &str = "
  const panels = {};
  for (const id of arguments[0]) {
    const svg = document.getElementById(`plot-${id}`);
    const lines = [...svg.querySelectorAll('path.line')].map((path) => {
      // The y of every point: the absolute coordinates after M and L.
      const ys = [];
      for (const [, y] of path.getAttribute('d').matchAll(/[ML][0-9.]+ ([0-9.]+)/g)) ys.push(Number(y));
      return {
        instance: path.dataset.instance,
        dashed: path.classList.contains('p50'),
        points: Number(path.dataset.points),
        segments: Number(path.dataset.segments),
        rise: ys.length ? Math.max(...ys) - Math.min(...ys) : 0,
      };
    });
    const labels = [...svg.querySelectorAll('text')].map((t) => t.textContent);
    panels[id] = { lines, labels, silent: svg.querySelectorAll('line.silent').length };
  }
  const legend = [...document.querySelectorAll('#legend li')].map((li) => ({
    name: li.dataset.instance, state: li.dataset.state, text: li.innerText,
  }));
  return { panels, legend, status: document.getElementById('plots-state').textContent };
";

async fn drawn(page: &Page) -> Value {
    page.script(DRAWN, json!([PANELS])).await
}

/// Polls what the page drew until `done` accepts it, for up to [`PATIENCE`]; a failure shows
/// the last drawing.
async fn until(page: &Page, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let drawn = drawn(page).await;
        if done(&drawn) {
            return drawn;
        }
        assert!(
            Instant::now() < deadline,
            "never {what}; the page drew {drawn:#}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The lines of `panel` for `instance`.
fn lines<'a>(drawn: &'a Value, panel: &str, instance: &str) -> Vec<&'a Value> {
    drawn["panels"][panel]["lines"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|line| line["instance"] == instance)
        .collect()
}

/// Whether every panel has a line of at least `points` points for each of `instances`.
fn every_panel_has(drawn: &Value, instances: &[String], points: u64) -> bool {
    PANELS.iter().all(|panel| {
        instances.iter().all(|instance| {
            lines(drawn, panel, instance)
                .iter()
                .any(|line| line["points"].as_u64() >= Some(points))
        })
    })
}

/// Whether some line of `panel` rises off a flat line: the plot shows a varying value.
fn rises(drawn: &Value, panel: &str) -> bool {
    drawn["panels"][panel]["lines"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|line| line["rise"].as_f64() > Some(1.0))
}

/// The legend's entry for `instance`.
fn legend<'a>(drawn: &'a Value, instance: &str) -> Option<&'a Value> {
    drawn["legend"]
        .as_array()?
        .iter()
        .find(|entry| entry["name"] == instance)
}

impl Page {
    /// Moves the mouse over the first element matching `css`, `right` pixels right of its
    /// middle.
    async fn hover(&self, css: &str, right: i64) {
        let mut origin = serde_json::Map::new();
        origin.insert(super::ELEMENT.to_owned(), self.find(css).await.into());
        let actions = json!({"actions": [{
            "type": "pointer",
            "id": "mouse",
            "parameters": {"pointerType": "mouse"},
            "actions": [{
                "type": "pointerMove",
                "duration": 0,
                "origin": origin,
                "x": right,
                "y": 0,
            }],
        }]});
        self.call("POST", "/actions", Some(actions)).await;
    }
}

/// Rounds of the load generator against the targets of the moment, until `stop`; the rounds
/// that ran to the end, and those that did not (an instance died under them).
async fn load(targets: Arc<Mutex<Vec<String>>>, stop: Arc<AtomicBool>, seed: u64) -> (u32, u32) {
    let operator = OperatorToken::new(OPERATOR).expect("the test's operator token");
    let (mut done, mut cut) = (0, 0);
    let mut round = seed;
    while !stop.load(Ordering::SeqCst) {
        round += 1;
        let targets = targets.lock().expect("the targets").clone();
        // Rounds of different sizes: the plots have something to show.
        let config = LoadConfig {
            targets,
            users: 40 + (round % 4) * 40,
            stock: 40,
            requests_per_user: 3,
            concurrency: 40,
            skus: 3,
            sku_stock: 30,
            edit_every: 3,
            operator: Some(operator.clone()),
        };
        match loadgen::run(&config).await {
            Ok(report) => {
                assert!(report.clean(), "an invariant broke under the plots' load");
                done += 1;
            }
            Err(_) => cut += 1,
        }
    }
    (done, cut)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_sees_each_instance_plotted_under_load_and_a_dead_one_said_to_be_unreachable()
{
    let shop = Shop::start(3, None).await;
    with_browser(true, |page| async move {
        let mut shop = shop;
        let names: Vec<String> = (0..3)
            .map(|i| shop.url(i).trim_start_matches("http://").to_owned())
            .collect();
        let targets = Arc::new(Mutex::new((0..3).map(|i| shop.url(i)).collect::<Vec<_>>()));
        let stop = Arc::new(AtomicBool::new(false));
        // Two load generators at once, so that one's audit between rounds leaves no lull.
        let loads: Vec<_> = (0..2)
            .map(|seed| tokio::spawn(load(targets.clone(), stop.clone(), seed)))
            .collect();

        page.switch_to(&page.window().await).await;
        page.operator_view(&shop.url(0)).await;
        let docs = screenshot_dir().ends_with("docs");
        if docs {
            tokio::time::sleep(Duration::from_secs(90)).await;
        }

        // Every panel draws a line for every instance, and the legend names each, live.
        let now = until(&page, "every instance plotted in every panel", |drawn| {
            every_panel_has(drawn, &names, 5)
                && ["purchases", "checkouts", "conflicts", "wait", "handovers"]
                    .iter()
                    .all(|panel| rises(drawn, panel))
                && names
                    .iter()
                    .all(|name| legend(drawn, name).is_some_and(|e| e["state"] == "live"))
        })
        .await;
        assert_eq!(
            now["legend"].as_array().map(Vec::len),
            Some(3),
            "one legend entry per instance: {now}"
        );
        let serving = legend(&now, &names[0]).unwrap();
        assert!(
            serving["text"]
                .as_str()
                .unwrap()
                .contains("serves this page"),
            "{serving}"
        );
        assert!(
            now["status"].as_str().unwrap().contains("a point a second"),
            "{now}"
        );
        // Axes with units: rates per second, waits in ms or s, times of day.
        for panel in PANELS {
            let labels: Vec<&str> = now["panels"][panel]["labels"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Value::as_str)
                .collect();
            let unit = |l: &str| {
                if panel == "wait" {
                    l.ends_with(" ms") || l.ends_with(" s")
                } else {
                    l.ends_with("/s")
                }
            };
            let with_units = labels.iter().filter(|l| unit(l)).count();
            assert!(with_units >= 3, "{panel}: {labels:?}");
            let time = |l: &str| l.len() >= 5 && l.as_bytes()[2] == b':';
            assert!(labels.iter().any(|l| time(l)), "{panel}: {labels:?}");
        }
        // The wait panel has a p99 and a dashed p50 line for each instance.
        for name in &names {
            let waits = lines(&now, "wait", name);
            assert_eq!(waits.len(), 2, "{name}: {waits:?}");
            assert!(waits.iter().any(|l| l["dashed"] == true), "{waits:?}");
        }
        // Hovering a plot (near its right end, where the load is) reads every instance's value
        // at that second.
        page.hover("#plot-checkouts", 140).await;
        let tip = page
            .wait_text("#tip-checkouts", |t| {
                names.iter().all(|n| t.contains(n)) && t.matches("/s").count() == 3
            })
            .await;
        assert!(tip.contains("/s"), "{tip}");
        page.screenshot("09-operator.png").await;
        // The readout goes with the mouse.
        page.hover("h1", 0).await;
        let hidden = "return document.getElementById('tip-checkouts').hidden;";
        assert_eq!(page.script(hidden, json!([])).await, true);

        // The third instance dies; the load goes on against the other two.
        targets.lock().unwrap().truncate(2);
        shop.instances[2].kill().await;
        let dead = &names[2];
        let down = until(&page, "the dead instance said to be unreachable", |drawn| {
            let said = legend(drawn, dead).is_some_and(|e| {
                e["state"] == "down" && e["text"].as_str().unwrap_or("").contains("unreachable")
            });
            said && drawn["panels"]["purchases"]["silent"] == 1
        })
        .await;
        // Its line is still there up to where it stopped; the others are live.
        for panel in PANELS {
            assert!(
                lines(&down, panel, dead)
                    .iter()
                    .all(|l| l["points"].as_u64() >= Some(5)),
                "{panel}: {down}"
            );
        }
        for name in &names[..2] {
            assert_eq!(legend(&down, name).unwrap()["state"], "live", "{down}");
        }
        let before: u64 = lines(&down, "purchases", &names[0])[0]["points"]
            .as_u64()
            .unwrap();
        until(&page, "the live instances still plotted", |drawn| {
            lines(drawn, "purchases", &names[0])
                .first()
                .is_some_and(|line| line["points"].as_u64() >= Some(before + 3))
        })
        .await;
        if docs {
            tokio::time::sleep(Duration::from_secs(20)).await;
        }
        page.screenshot("13-operator-instance-down.png").await;

        // Back on the same address: the same line goes on, after a gap.
        shop.restart(2).await;
        targets.lock().unwrap().push(shop.url(2));
        until(
            &page,
            "the instance back, its line resumed after a gap",
            |drawn| {
                let live = legend(drawn, dead).is_some_and(|e| e["state"] == "live");
                let resumed = lines(drawn, "purchases", dead)
                    .first()
                    .is_some_and(|l| l["segments"].as_u64() >= Some(2));
                live && resumed && drawn["panels"]["purchases"]["silent"] == 0
            },
        )
        .await;

        stop.store(true, Ordering::SeqCst);
        let mut rounds = 0;
        for load in loads {
            let (done, _cut) = load.await.expect("the load generator");
            rounds += done;
        }
        assert!(rounds >= 2, "the load ran: {rounds} rounds");
    })
    .await;
}
