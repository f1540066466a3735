// SPDX-License-Identifier: GPL-2.0
//! Interrupt sources of a vCPU: the pending bitmap, the clock-event timer,
//! and waking or kicking the vCPU's thread.
//!
//! A [`VcpuIrq`] is shared (an `Arc`) between the run loop, the timer
//! callback (hard interrupt context) and other threads raising interrupts
//! with `LGUEST_IRQ`, none of which may take the VM's mutex. So it uses an
//! atomic bitmap for pending interrupts and one irq-safe spinlock, `task`,
//! for the thread currently inside RUN. Lock order: `LguestFile::vm` (the
//! VM mutex) may be held when taking `task`; never the other way round.
//!
//! The wake-up protocol is the scheduler's classic one: a raiser sets the
//! bit, then wakes the task; the run loop marks itself sleeping, then checks
//! the bits, then sleeps. One of the two always sees the other.

use core::sync::atomic::{
    AtomicU64,
    Ordering, //
};
use kernel::{
    bindings, impl_has_hr_timer, new_spinlock_irq,
    prelude::*,
    sync::{
        aref::ARef,
        Arc,
        ArcBorrow,
        SpinLockIrq, //
    },
    task::Task,
    time::{
        hrtimer::{
            ArcHrTimerHandle,
            HrTimer,
            HrTimerCallback,
            HrTimerCallbackContext,
            HrTimerPointer,
            HrTimerRestart,
            RelativePinnedMode, //
        },
        Delta,
        Monotonic, //
    },
};

use crate::{
    helpers,
    uapi, //
};

/// The shortest clock event the host arms (TCG cannot do better anyway).
const MIN_CLOCKEVENT_NS: u64 = 1000;

/// Interrupt state of one vCPU.
#[pin_data]
pub(crate) struct VcpuIrq {
    #[pin]
    timer: HrTimer<Self>,
    /// Pending interrupts, bit n = IRQ n.
    pending: AtomicU64,
    /// The thread inside RUN for this vCPU, if any.
    #[pin]
    task: SpinLockIrq<Option<ARef<Task>>>,
    /// Interrupts raised since creation: the run loop compares it before
    /// and after preparing an entry, so that a raise in between is not left
    /// waiting for the next exit.
    raised: AtomicU64,
}

impl_has_hr_timer! {
    impl HasHrTimer<Self> for VcpuIrq {
        mode: RelativePinnedMode<Monotonic>, field: self.timer
    }
}

impl HrTimerCallback for VcpuIrq {
    type Pointer<'a> = Arc<Self>;

    fn run(this: ArcBorrow<'_, Self>, _ctx: HrTimerCallbackContext<'_, Self>) -> HrTimerRestart {
        // The guest's clock event: IRQ 0. One-shot; the guest re-arms.
        this.raise(0);
        HrTimerRestart::NoRestart
    }
}

/// An armed clock event; dropping it cancels the timer.
pub(crate) type ClockEvent = ArcHrTimerHandle<VcpuIrq>;

impl VcpuIrq {
    /// A new, quiet interrupt state.
    pub(crate) fn new() -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Self {
                timer <- HrTimer::new(),
                pending: AtomicU64::new(0),
                task <- new_spinlock_irq!(None, "VcpuIrq::task"),
                raised: AtomicU64::new(0),
            }),
            GFP_KERNEL,
        )
    }

    /// Marks IRQ `irq` pending and wakes or kicks the vCPU's thread, so that
    /// it is delivered as soon as the guest can take it. Any context.
    pub(crate) fn raise(&self, irq: u32) {
        if irq as usize >= uapi::LGUEST_IRQS {
            return;
        }
        self.pending.fetch_or(1 << irq, Ordering::SeqCst);
        self.raised.fetch_add(1, Ordering::SeqCst);
        self.kick();
    }

    /// Wakes the thread in RUN if it sleeps (HALT) and forces it out of the
    /// guest if it runs on another CPU.
    pub(crate) fn kick(&self) {
        let task = self.task.lock();
        if let Some(t) = task.as_ref() {
            // SAFETY: `t` is a counted reference, so the task is alive; both
            // functions may be called from any context.
            unsafe {
                bindings::wake_up_process(t.as_ptr());
                bindings::kick_process(t.as_ptr());
            }
        }
    }

    /// How many interrupts were raised so far (see `raised`).
    pub(crate) fn raised(&self) -> u64 {
        self.raised.load(Ordering::SeqCst)
    }

    /// The pending bitmap.
    pub(crate) fn pending(&self) -> u64 {
        self.pending.load(Ordering::SeqCst)
    }

    /// Takes IRQ `irq` off the pending bitmap (it is being delivered).
    pub(crate) fn clear(&self, irq: u32) {
        self.pending.fetch_and(!(1u64 << irq), Ordering::SeqCst);
    }

    /// Sleeps (interruptibly, using no CPU) unless an interrupt not in
    /// `blocked` is pending; returns when one is raised, a signal arrives,
    /// or spuriously. Called with no lock held, by the task recorded with
    /// [`VcpuIrq::set_task`], which every raise wakes: the check comes after
    /// marking ourselves asleep, so a raise before it is seen here and one
    /// after it wakes us.
    pub(crate) fn sleep_unless(&self, blocked: u64) {
        helpers::set_current_interruptible();
        if self.pending() & !blocked == 0 && !helpers::signal_pending() {
            helpers::schedule();
        }
        helpers::set_current_running();
    }

    /// Records (or forgets) the thread that runs this vCPU.
    pub(crate) fn set_task(&self, task: Option<ARef<Task>>) {
        *self.task.lock() = task;
    }

    /// Arms the clock event `ns` nanoseconds from now.
    pub(crate) fn arm(self: &Arc<Self>, ns: u64) -> ClockEvent {
        let ns = ns.clamp(MIN_CLOCKEVENT_NS, i64::MAX as u64);
        self.clone().start(Delta::from_nanos(ns as i64))
    }
}

/// An eventfd bound to a guest interrupt: each signal of the eventfd raises
/// the interrupt, from the signaller's context (no launcher round trip).
///
/// # Invariants
///
/// `raw` is a live binding from `irqfd_attach` whose callback data is
/// `irq`, a pointer from `Arc::into_raw` that this value owns.
pub(crate) struct IrqFd {
    raw: *mut core::ffi::c_void,
    irq: *const VcpuIrq,
    line: u32,
}

// SAFETY: The binding may be detached from any thread; `irq` is an Arc.
unsafe impl Send for IrqFd {}
// SAFETY: `&IrqFd` only reads plain fields.
unsafe impl Sync for IrqFd {}

impl IrqFd {
    /// Binds eventfd `fd` to IRQ `line` of `irq`.
    pub(crate) fn attach(irq: &Arc<VcpuIrq>, fd: i32, line: u32) -> Result<Self> {
        let data = Arc::into_raw(irq.clone());
        // SAFETY: `data` stays valid until Drop (we own that reference).
        match unsafe { crate::helpers::irqfd_attach(fd, data as *mut _, line) } {
            // INVARIANT: `raw` is live and its data is `data`.
            Ok(raw) => Ok(Self {
                raw,
                irq: data,
                line,
            }),
            Err(e) => {
                // SAFETY: `data` came from Arc::into_raw above, unused.
                drop(unsafe { Arc::from_raw(data) });
                Err(e)
            }
        }
    }

    /// Whether this binds eventfd `fd` to IRQ `line`.
    pub(crate) fn is(&self, fd: i32, line: u32) -> bool {
        // SAFETY: By the type invariant `raw` is live.
        self.line == line && unsafe { crate::helpers::irqfd_matches(self.raw, fd) }
    }
}

impl Drop for IrqFd {
    fn drop(&mut self) {
        // SAFETY: By the type invariant `raw` is live; detached once, here.
        unsafe { crate::helpers::irqfd_detach(self.raw) };
        // SAFETY: No callback can run any more; this is our reference.
        drop(unsafe { Arc::from_raw(self.irq) });
    }
}

/// Called by an eventfd's wake-up (`lg_irqfd_wakeup` in `lg_helpers.c`).
///
/// # Safety
///
/// `data` is the `VcpuIrq` an [`IrqFd`] holds a reference to.
#[no_mangle]
pub(crate) unsafe extern "C" fn lguest_irqfd_fire(data: *mut core::ffi::c_void, line: u32) {
    // SAFETY: The IrqFd that registered `data` keeps it alive until after it
    // detached, which waits for wake-ups in progress (the eventfd's lock).
    let irq = unsafe { &*(data as *const VcpuIrq) };
    irq.raise(line);
}
