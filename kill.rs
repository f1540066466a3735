// SPDX-License-Identifier: GPL-2.0
//! Killing a guest: the reason the host gives (`Kill`, made with `kill!`)
//! and the names of exception vectors for it.
//!
//! Hypercalls, shadow paging, interrupt delivery and the run loop all end
//! a guest that breaks the rules with `Err(Kill)`; the run loop records it
//! (`Vm::kill`) and RUN reports it to the launcher.

use kernel::str::CString;

/// Why the host kills a guest.
pub(crate) enum Kill {
    /// The reason, for the launcher and the kernel log.
    Reason(CString),
    /// There was not even memory to format the reason.
    NoMemory,
}

impl Kill {
    /// The reason as bytes (no NUL).
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Kill::Reason(s) => s.to_bytes(),
            Kill::NoMemory => b"killed (out of memory while formatting the reason)",
        }
    }
}

/// Builds a kill reason: `kill!("format", args)` is an `Err(Kill)`.
macro_rules! kill {
    ($($arg:tt)*) => {
        Err(::kernel::str::CString::try_from_fmt(fmt!($($arg)*))
            .map_or($crate::kill::Kill::NoMemory, $crate::kill::Kill::Reason))
    };
}
pub(crate) use kill;

/// The name of an exception vector, for kill messages.
pub(crate) fn trap_name(vector: u64) -> &'static str {
    match vector {
        0 => "#DE divide error",
        1 => "#DB debug",
        3 => "#BP breakpoint",
        4 => "#OF overflow",
        5 => "#BR bound range",
        6 => "#UD invalid opcode",
        7 => "#NM device not available (an XFD-armed component: AMX)",
        10 => "#TS invalid TSS",
        11 => "#NP segment not present",
        12 => "#SS stack fault",
        13 => "#GP general protection",
        16 => "#MF x87 error",
        17 => "#AC alignment check",
        19 => "#XM SIMD error",
        21 => "#CP control protection",
        _ => "exception",
    }
}
