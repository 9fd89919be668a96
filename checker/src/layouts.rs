//! Key layouts of earlier versions, frozen: their scripts exactly as the server got them, for
//! `Locker`s of two versions side by side against one Redis (see `dlock_core::protocol::layout`).
//!
//! Layout 1 is the untagged layout: a lock's key a string whose tokens carry no layout tag, as
//! written from the change that made it a string (after 0.1.0, which kept a hash) until tags
//! came (commit 9b1d62d). Its scripts are the text that code sent with `EVAL` (comments left
//! out, helpers put in), one file per script, and are never edited: a change to this version's
//! scripts must keep working beside them.

use dlock_core::protocol::layout::FrozenLayout;

/// Layout 1's scripts, by their names in this version.
const LAYOUT_1: &[(&str, &str)] = &[
    ("ACQUIRE", include_str!("../fixtures/layout-1/ACQUIRE.lua")),
    (
        "ACQUIRE_ALL",
        include_str!("../fixtures/layout-1/ACQUIRE_ALL.lua"),
    ),
    (
        "ACQUIRE_FAIR",
        include_str!("../fixtures/layout-1/ACQUIRE_FAIR.lua"),
    ),
    (
        "ACQUIRE_PERMIT",
        include_str!("../fixtures/layout-1/ACQUIRE_PERMIT.lua"),
    ),
    (
        "ACQUIRE_READ",
        include_str!("../fixtures/layout-1/ACQUIRE_READ.lua"),
    ),
    (
        "ACQUIRE_WRITE",
        include_str!("../fixtures/layout-1/ACQUIRE_WRITE.lua"),
    ),
    ("ECHO", include_str!("../fixtures/layout-1/ECHO.lua")),
    ("FENCE", include_str!("../fixtures/layout-1/FENCE.lua")),
    (
        "FORCE_RELEASE",
        include_str!("../fixtures/layout-1/FORCE_RELEASE.lua"),
    ),
    ("HANDOFF", include_str!("../fixtures/layout-1/HANDOFF.lua")),
    ("HOLDS", include_str!("../fixtures/layout-1/HOLDS.lua")),
    (
        "HOLDS_MEMBER",
        include_str!("../fixtures/layout-1/HOLDS_MEMBER.lua"),
    ),
    ("INSPECT", include_str!("../fixtures/layout-1/INSPECT.lua")),
    (
        "LEAVE_TURN",
        include_str!("../fixtures/layout-1/LEAVE_TURN.lua"),
    ),
    ("PERMITS", include_str!("../fixtures/layout-1/PERMITS.lua")),
    ("RELEASE", include_str!("../fixtures/layout-1/RELEASE.lua")),
    (
        "RELEASE_PERMIT",
        include_str!("../fixtures/layout-1/RELEASE_PERMIT.lua"),
    ),
    (
        "RELEASE_READ",
        include_str!("../fixtures/layout-1/RELEASE_READ.lua"),
    ),
    ("RENEW", include_str!("../fixtures/layout-1/RENEW.lua")),
    (
        "SET_PERMITS",
        include_str!("../fixtures/layout-1/SET_PERMITS.lua"),
    ),
];

/// Layout 1, for [`LockerBuilder::frozen_layout`](dlock_core::LockerBuilder::frozen_layout):
/// its scripts, and its untagged tokens.
pub fn layout_1() -> &'static FrozenLayout {
    static LAYOUT: std::sync::OnceLock<&'static FrozenLayout> = std::sync::OnceLock::new();
    LAYOUT.get_or_init(|| {
        FrozenLayout::leak("", LAYOUT_1).unwrap_or_else(|missing| panic!("{missing}"))
    })
}
