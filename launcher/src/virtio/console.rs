// SPDX-License-Identifier: GPL-2.0
//! virtio-console (device ID 3), one port without the multiport feature:
//! queue 0 (receiveq) carries host input to the guest, queue 1 (transmitq)
//! the guest's output to the host.
//!
//! Input is read from the host fd (stdin) only while the driver has posted
//! receive buffers: with none, the fd is not polled until the driver kicks
//! queue 0, so a guest that never reads its console never takes the
//! launcher's stdin away from anyone. With [`Console::with_input_hold`]
//! (the launcher's), what is typed before the guest's console is up is
//! kept for it: input waits after DRIVER_OK until the driver has sent
//! output once, or until the hold's time has passed. Linux's
//! virtio_console gives the receive queue its buffers before it lists the
//! port, and drops what arrives for a port it cannot find; its first
//! output comes through the listed port.
//!
//! On a terminal the console offers `VIRTIO_CONSOLE_F_SIZE`
//! ([`Console::with_window_size`]): the window's columns and rows in the
//! configuration space, updated on SIGWINCH with a configuration interrupt
//! (the guest's tty gets the size and its foreground processes SIGWINCH).
//! And it watches for the escape key ([`Escape`]: `Ctrl-]` then `x`
//! stops the guest, as a wedged guest otherwise keeps the terminal raw).
//!
//! Output goes either straight to a writer ([`Console::new`], for tests
//! and files) or, for the launcher's stdout, to a bounded queue that a
//! writer thread of its own empties ([`Console::with_writer_thread`]). The
//! device thread then never blocks in a host write while it holds the
//! device's lock, which the vCPU thread needs for status changes: when the
//! queue is full (stdout is a pipe nobody reads, or a stopped terminal) the
//! device stops taking output chains and polls the queue's "room" eventfd
//! instead. A full queue holds the guest's output back; it never loses it.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{DeviceError, Events, Queues, VirtioDevice, VIRTIO_ID_CONSOLE};

/// Queue numbers.
const RX: usize = 0;
const TX: usize = 1;

/// `VIRTIO_CONSOLE_F_SIZE`: the configuration space has the window size.
pub const VIRTIO_CONSOLE_F_SIZE: u64 = 1 << 0;

/// The most bytes read from the host per receive buffer.
const INPUT_CHUNK: usize = 4096;
/// Bytes of output copied per step.
const OUTPUT_CHUNK: usize = 16 * 1024;
/// The output queue is full at this many bytes; one chain adds at most
/// this many more (the rest of a longer chain is dropped).
pub const QUEUE_MAX: usize = 256 * 1024;

/// The output queue between the device and its writer thread.
struct OutQueue {
    state: Mutex<OutState>,
    /// Signalled when bytes arrive, when the writer has written some, and
    /// at close.
    cond: Condvar,
    /// Readable when the queue has room again (the device polls it while
    /// it holds output back).
    room: EventFd,
}

#[derive(Default)]
struct OutState {
    data: VecDeque<u8>,
    /// The writer thread holds bytes it is writing.
    writing: bool,
    /// The device is gone: write what is left and end.
    closed: bool,
}

impl OutQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, OutState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn full(&self) -> bool {
        self.lock().data.len() >= QUEUE_MAX
    }

    fn push(&self, bytes: &[u8]) {
        self.lock().data.extend(bytes);
        self.cond.notify_all();
    }

    /// The writer thread's loop.
    fn serve(&self, mut out: Box<dyn Write + Send>) {
        if let Err(e) = crate::sandbox::drop_capabilities() {
            log::warn!("console writer: {e}");
        }
        crate::run::enter_or_exit(crate::sandbox::Role::Helper);
        let mut broken = false;
        loop {
            let chunk: Vec<u8> = {
                let mut st = self.lock();
                while st.data.is_empty() && !st.closed {
                    st = self.cond.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                if st.data.is_empty() {
                    return;
                }
                let n = st.data.len().min(64 * 1024);
                st.writing = true;
                st.data.drain(..n).collect()
            };
            if !broken {
                if let Err(e) = out.write_all(&chunk).and_then(|()| out.flush()) {
                    log::warn!("console output: {e}; further output is dropped");
                    broken = true;
                }
            }
            let mut st = self.lock();
            st.writing = false;
            if st.data.len() < QUEUE_MAX / 2 {
                let _ = self.room.write(1);
            }
            self.cond.notify_all();
        }
    }
}

/// Where output goes.
enum Sink {
    /// Written as it comes, by the device thread.
    Direct(Box<dyn Write + Send>),
    /// Queued for the writer thread.
    Queued(Arc<OutQueue>),
}

/// Where the virtio console (`--console`) or the hypercall console
/// (`--serial`) is connected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConsoleMode {
    /// None (`--console off`: no virtio console; `--serial off`: the
    /// guest's early output is dropped).
    Off,
    /// The launcher's stdin and stdout (raw mode when stdin is a terminal).
    Tty,
    /// Output appended to a file, no input.
    File(std::path::PathBuf),
    /// A new pseudo-terminal, whose name the launcher prints (virtio
    /// console only).
    Pty,
}

impl std::str::FromStr for ConsoleMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Self::Off),
            "tty" => Ok(Self::Tty),
            "pty" => Ok(Self::Pty),
            _ => match s.strip_prefix("file=") {
                Some(p) if !p.is_empty() => Ok(Self::File(p.into())),
                _ => Err(format!("{s:?}: expected off, tty, pty or file=PATH")),
            },
        }
    }
}

/// Opens a new pseudo-terminal: its master (for the device) and the
/// slave's path (for the user).
pub fn open_pty() -> std::io::Result<(File, String)> {
    use std::os::fd::FromRawFd;
    // SAFETY: posix_openpt takes flags only and returns a new descriptor.
    let fd = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    let master = unsafe { File::from_raw_fd(fd) };
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: grantpt/unlockpt take the descriptor; ptsname_r writes at
    // most `name.len()` bytes, NUL included, into the live array.
    let ok = unsafe {
        libc::grantpt(fd) == 0 && libc::unlockpt(fd) == 0 && libc::ptsname_r(fd, name.as_mut_ptr(), name.len()) == 0
    };
    if !ok {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: ptsname_r wrote a NUL-terminated string into `name`.
    let path = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
    // Raw from the start, as QEMU makes its pty: with the line
    // discipline's echo on, what the guest writes before a terminal
    // program opens the slave would come back to the guest as input.
    // SAFETY: an all-zero termios is a valid value for tcgetattr to fill.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: tcgetattr, cfmakeraw and tcsetattr take the live descriptor
    // and a termios this frame owns.
    let ok = unsafe {
        libc::tcgetattr(fd, &mut t) == 0 && {
            libc::cfmakeraw(&mut t);
            libc::tcsetattr(fd, libc::TCSANOW, &t) == 0
        }
    };
    if !ok {
        return Err(std::io::Error::last_os_error());
    }
    Ok((master, path))
}

/// What the escape key asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EscapeAction {
    /// Stop the guest (`x` or `.` after the key).
    Stop,
    /// Show the commands (`?` or `h`).
    Help,
}

/// The console's escape key, as `virsh console` and ssh have one: the key
/// (`Ctrl-]` by default) is held back and the next byte says what to do:
/// `x` or `.` stops the guest, `?` or `h` shows the commands, the key
/// again sends the key itself, anything else sends both bytes.
#[derive(Clone, Debug)]
pub struct Escape {
    key: u8,
    /// The key came last; the next byte is a command.
    armed: bool,
}

impl Escape {
    /// Watches for `key` (a control character).
    pub fn new(key: u8) -> Self {
        Self { key, armed: false }
    }

    /// The help text, for a raw terminal.
    pub fn help(&self) -> String {
        let k = describe_key(self.key);
        format!("\r\nlguest: {k} x  stop the guest\r\nlguest: {k} {k}  send {k}\r\nlguest: {k} ?  this help\r\n")
    }

    /// Passes `input` on to `out` without the escape sequences in it; what
    /// the last of them asked for, if anything. Nothing after a stop is
    /// passed on.
    pub fn filter(&mut self, input: &[u8], out: &mut Vec<u8>) -> Option<EscapeAction> {
        let mut action = None;
        for &b in input {
            if !self.armed {
                if b == self.key {
                    self.armed = true;
                } else {
                    out.push(b);
                }
                continue;
            }
            self.armed = false;
            match b {
                b'x' | b'X' | b'.' => return Some(EscapeAction::Stop),
                b'?' | b'h' | b'H' => action = Some(EscapeAction::Help),
                _ if b == self.key => out.push(b),
                _ => out.extend([self.key, b]),
            }
        }
        action
    }
}

/// `Ctrl-]` for 0x1d: the caret form of a control character.
pub fn describe_key(key: u8) -> String {
    match key {
        0..=0x1f => format!("Ctrl-{}", char::from(key | 0x40)),
        _ => format!("{:?}", char::from(key)),
    }
}

/// `--escape`: the key, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EscapeKey(pub Option<u8>);

/// Parses `--escape`: `^]`, `^A`..`^_` (a control character, in caret
/// form) or `none`.
pub fn parse_escape(s: &str) -> Result<EscapeKey, String> {
    if s == "none" {
        return Ok(EscapeKey(None));
    }
    match s.as_bytes() {
        [b'^', c @ (b'@'..=b'_' | b'a'..=b'z')] => Ok(EscapeKey(Some(c.to_ascii_uppercase() & 0x1f))),
        _ => Err(format!("{s:?}: expected a control character in caret form (^] or ^A to ^_) or none")),
    }
}

/// The window size the guest's console has, from a terminal.
struct WindowSize {
    /// The terminal (the console's input).
    fd: RawFd,
    /// Written by SIGWINCH's handler (`signals::set_winch_fd`).
    winch: EventFd,
    /// Columns and rows last put in the configuration space.
    cols: u16,
    rows: u16,
    /// They changed since the configuration was last written.
    changed: bool,
}

impl WindowSize {
    /// The configuration space: `struct virtio_console_config` (cols, rows,
    /// then max_nr_ports and emerg_wr, unused without their features).
    fn config(&self) -> Vec<u8> {
        let mut c = vec![0u8; 12];
        c[0..2].copy_from_slice(&self.cols.to_le_bytes());
        c[2..4].copy_from_slice(&self.rows.to_le_bytes());
        c
    }

    /// Reads the terminal's size again; whether it changed.
    fn refresh(&mut self) -> bool {
        match super::term::window_size(self.fd) {
            Some((cols, rows)) if (cols, rows) != (self.cols, self.rows) => {
                (self.cols, self.rows) = (cols, rows);
                self.changed = true;
                true
            }
            _ => false,
        }
    }
}

/// The console device.
pub struct Console {
    input: Option<File>,
    output: Sink,
    /// The output queue was full: no output chain is taken until it has
    /// room again.
    tx_blocked: bool,
    /// Bytes of one chain beyond [`QUEUE_MAX`] were dropped (reported once).
    tx_cut: bool,
    /// No receive buffer: wait for a kick of queue 0 before reading input.
    rx_wait: bool,
    /// The input reached its end.
    eof: bool,
    /// Output failed once (reported once).
    output_broken: bool,
    /// The window size, on a terminal.
    size: Option<WindowSize>,
    /// How long input waits after DRIVER_OK for the driver's first output.
    hold: Option<Duration>,
    /// Input waits until then, or until the driver sends output.
    held_until: Option<Instant>,
    /// The escape key, on a terminal.
    escape: Option<Escape>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").field("input", &self.input).field("eof", &self.eof).finish_non_exhaustive()
    }
}

impl Console {
    /// A console reading `input` (if any) and writing `output` directly.
    pub fn new(input: Option<File>, output: Box<dyn Write + Send>) -> Self {
        Self {
            input,
            output: Sink::Direct(output),
            tx_blocked: false,
            tx_cut: false,
            rx_wait: false,
            eof: false,
            output_broken: false,
            size: None,
            hold: None,
            held_until: None,
            escape: None,
        }
    }

    /// Offers `VIRTIO_CONSOLE_F_SIZE` with the window size of the input,
    /// if it is a terminal with a size, and follows it on SIGWINCH. Only one console
    /// may have it (SIGWINCH's handler writes to one eventfd).
    pub fn with_window_size(mut self) -> std::io::Result<Self> {
        let Some(fd) = self.input.as_ref().map(AsRawFd::as_raw_fd) else { return Ok(self) };
        // A serial line's terminal has no size (0 x 0): nothing to offer.
        let Some((cols, rows)) = super::term::window_size(fd).filter(|&(c, r)| c > 0 && r > 0) else {
            return Ok(self);
        };
        let winch = EventFd::new(EFD_NONBLOCK)?;
        crate::signals::set_winch_fd(winch.as_raw_fd());
        self.size = Some(WindowSize { fd, winch, cols, rows, changed: false });
        Ok(self)
    }

    /// Holds input back after DRIVER_OK until the driver has sent output
    /// once, for at most `hold` (see the module's documentation).
    pub fn with_input_hold(mut self, hold: Duration) -> Self {
        self.hold = Some(hold);
        self
    }

    /// Watches the input for the escape key `key`.
    pub fn with_escape(mut self, key: u8) -> Self {
        self.escape = Some(Escape::new(key));
        self
    }

    /// Ends the hold once its time has passed.
    fn end_hold_if_due(&mut self) {
        if self.held_until.is_some_and(|t| Instant::now() >= t) {
            self.held_until = None;
        }
    }

    /// A console whose output a thread of its own writes to `output`
    /// (stdout), so that a blocked `output` never blocks the device.
    pub fn with_writer_thread(input: Option<File>, output: Box<dyn Write + Send>) -> std::io::Result<Self> {
        let queue = Arc::new(OutQueue {
            state: Mutex::new(OutState::default()),
            cond: Condvar::new(),
            room: EventFd::new(EFD_NONBLOCK)?,
        });
        let q = Arc::clone(&queue);
        std::thread::Builder::new().name("lguest-console-out".into()).spawn(move || q.serve(output))?;
        let mut c = Self::new(input, Box::new(std::io::sink()));
        c.output = Sink::Queued(queue);
        Ok(c)
    }

    /// Writes what the device took to its output; false if the queue is
    /// full (take no more chains).
    fn put(&mut self, bytes: &[u8]) {
        match &mut self.output {
            Sink::Direct(out) => {
                if !self.output_broken {
                    if let Err(e) = out.write_all(bytes) {
                        log::warn!("console output: {e}; further output is dropped");
                        self.output_broken = true;
                    }
                }
            }
            Sink::Queued(q) => q.push(bytes),
        }
    }

    fn flush(&mut self) {
        if let Sink::Direct(out) = &mut self.output {
            if !self.output_broken {
                let _ = out.flush();
            }
        }
    }

    fn queue_full(&self) -> bool {
        matches!(&self.output, Sink::Queued(q) if q.full())
    }

    fn transmit(&mut self, qs: &mut Queues<'_>) -> Result<(), DeviceError> {
        self.tx_blocked = false;
        'ring: loop {
            qs.disable_notification(TX)?;
            loop {
                if qs.stopping() {
                    break 'ring;
                }
                if self.queue_full() {
                    // Poll the queue's room instead; the driver's kicks
                    // stay off meanwhile.
                    self.tx_blocked = true;
                    break 'ring;
                }
                let Some(chain) = qs.pop(TX)? else { break };
                // The guest's console is up: what was typed may go.
                self.held_until = None;
                if !chain.writable.is_empty() {
                    return Err(DeviceError::Request { queue: TX, why: "a device-writable buffer in output".into() });
                }
                // In bounded pieces: a chain may be up to 4 GiB long; at
                // most QUEUE_MAX bytes of it are kept.
                let mut reader = chain.reader();
                let mut buf = [0u8; OUTPUT_CHUNK];
                let mut taken = 0usize;
                loop {
                    if qs.stopping() {
                        break;
                    }
                    let n = reader.read(qs.mem(), &mut buf);
                    if n == 0 {
                        break;
                    }
                    if taken >= QUEUE_MAX {
                        if !self.tx_cut {
                            log::warn!("console: an output buffer over {QUEUE_MAX} bytes; the rest is dropped");
                            self.tx_cut = true;
                        }
                        break;
                    }
                    taken += n;
                    self.put(&buf[..n]);
                }
                self.flush();
                qs.add_used(TX, chain.head, 0)?;
                qs.stats().queues[TX].count(chain.readable_len());
            }
            if !qs.enable_notification(TX)? {
                break;
            }
        }
        qs.notify(TX)?;
        Ok(())
    }

    fn receive(&mut self, qs: &mut Queues<'_>) -> Result<(), DeviceError> {
        let Some(input) = self.input.as_mut() else { return Ok(()) };
        let chain = match qs.pop(RX)? {
            Some(chain) => chain,
            None => {
                // Ask for a kick when buffers come; they may have come already.
                if !qs.enable_notification(RX)? {
                    self.rx_wait = true;
                    return Ok(());
                }
                match qs.pop(RX)? {
                    Some(chain) => chain,
                    None => {
                        self.rx_wait = true;
                        return Ok(());
                    }
                }
            }
        };
        if !chain.readable.is_empty() {
            return Err(DeviceError::Request { queue: RX, why: "a device-readable buffer for input".into() });
        }
        // CAST: min with a usize fits usize.
        let room = chain.writable_len().min(INPUT_CHUNK as u64) as usize;
        if room == 0 {
            qs.add_used(RX, chain.head, 0)?;
            return Ok(());
        }
        let mut buf = [0u8; INPUT_CHUNK];
        let n = match input.read(&mut buf[..room]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::Interrupted => {
                qs.unpop(RX);
                return Ok(());
            }
            Err(e) => {
                log::warn!("console input: {e}; no more input");
                0
            }
        };
        if n == 0 {
            self.eof = true;
            qs.unpop(RX);
            return Ok(());
        }
        let mut filtered = Vec::new();
        let bytes = match self.escape.as_mut() {
            Some(esc) => {
                match esc.filter(&buf[..n], &mut filtered) {
                    Some(EscapeAction::Stop) => {
                        qs.unpop(RX);
                        self.eof = true;
                        crate::signals::escape();
                        return Ok(());
                    }
                    Some(EscapeAction::Help) => eprint!("{}", esc.help()),
                    None => {}
                }
                if filtered.is_empty() {
                    qs.unpop(RX);
                    return Ok(());
                }
                &filtered[..]
            }
            None => &buf[..n],
        };
        let written = chain.writer().write(qs.mem(), bytes);
        // CAST: at most INPUT_CHUNK.
        qs.add_used(RX, chain.head, written as u32)?;
        qs.stats().queues[RX].count(written as u64);
        qs.notify(RX)?;
        Ok(())
    }
}

impl VirtioDevice for Console {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_CONSOLE
    }

    fn name(&self) -> String {
        "console".into()
    }

    fn features(&self) -> u64 {
        if self.size.is_some() {
            VIRTIO_CONSOLE_F_SIZE
        } else {
            0
        }
    }

    fn queue_max(&self) -> Vec<u16> {
        vec![64, 64]
    }

    fn config(&self) -> Vec<u8> {
        self.size.as_ref().map(WindowSize::config).unwrap_or_default()
    }

    fn activate(&mut self, _features: u64) -> Result<(), DeviceError> {
        self.held_until = self.hold.map(|h| Instant::now() + h);
        Ok(())
    }

    fn reset(&mut self) {
        self.rx_wait = false;
        self.tx_blocked = false;
        self.held_until = None;
    }

    /// Three entries at fixed places, -1 (which poll ignores) when not
    /// wanted: the input, the output queue's room while output is held
    /// back, and SIGWINCH's eventfd.
    fn input_fds(&self) -> Vec<RawFd> {
        let input = match &self.input {
            Some(f) if !self.eof && !self.rx_wait && self.held_until.is_none() => f.as_raw_fd(),
            _ => -1,
        };
        let room = match &self.output {
            Sink::Queued(q) if self.tx_blocked => q.room.as_raw_fd(),
            _ => -1,
        };
        let winch = self.size.as_ref().map_or(-1, |s| s.winch.as_raw_fd());
        vec![input, room, winch]
    }

    fn timeout(&self) -> Option<Duration> {
        self.held_until.map(|t| t.saturating_duration_since(Instant::now()))
    }

    fn config_update(&mut self) -> Option<Vec<u8>> {
        let size = self.size.as_mut()?;
        if !std::mem::take(&mut size.changed) {
            return None;
        }
        Some(size.config())
    }

    fn process(&mut self, qs: &mut Queues<'_>, events: &Events) -> Result<(), DeviceError> {
        if events.queue(RX) {
            self.rx_wait = false;
        }
        // SIGWINCH, or the start (a resize between the bus's set-up and
        // DRIVER_OK; activate() runs on the vCPU thread, whose seccomp
        // filter has no TIOCGWINSZ, so the size is read here).
        if events.input & 4 != 0 || events.start {
            if let Some(size) = self.size.as_mut() {
                let _ = size.winch.read();
                size.refresh();
            }
        }
        // A hold whose time has passed ends; the input is polled again
        // from the next round on.
        self.end_hold_if_due();
        let room = events.input & 2 != 0;
        if room {
            if let Sink::Queued(q) = &self.output {
                let _ = q.room.read();
            }
        }
        if events.queue(TX) || (room && self.tx_blocked) {
            self.transmit(qs)?;
        }
        if events.input & 1 != 0 && !self.eof && !self.rx_wait && self.held_until.is_none() {
            self.receive(qs)?;
        }
        Ok(())
    }

    fn stats(&self, s: &super::DeviceStats) -> String {
        format!(
            "  {} bytes out, {} bytes in\n",
            s.queues[TX].bytes.load(Ordering::Relaxed),
            s.queues[RX].bytes.load(Ordering::Relaxed)
        )
    }
}

impl Drop for Console {
    /// Lets the writer thread write what is queued and end; waits for it
    /// unless the launcher is stopping on a signal (then the watchdog's
    /// bound applies, and the output is not worth a hang).
    fn drop(&mut self) {
        if self.size.is_some() {
            crate::signals::set_winch_fd(-1);
        }
        let Sink::Queued(q) = &self.output else { return };
        let mut st = q.lock();
        st.closed = true;
        q.cond.notify_all();
        while (!st.data.is_empty() || st.writing) && crate::signals::stop_signal().is_none() {
            st = match q.cond.wait_timeout(st, Duration::from_millis(50)) {
                Ok((st, _)) => st,
                Err(e) => e.into_inner().0,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// The new pty is raw before anyone opens its slave: no echo (which
    /// would send the guest's output back to it as input), no line
    /// editing, no output processing.
    #[test]
    fn pty_starts_raw() {
        let (_master, path) = open_pty().expect("open_pty");
        let slave = std::fs::OpenOptions::new().read(true).write(true).open(&path).expect("open slave");
        // SAFETY: an all-zero termios is a valid value for tcgetattr to fill.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr takes the live descriptor and a termios we own.
        assert_eq!(unsafe { libc::tcgetattr(slave.as_raw_fd(), &mut t) }, 0);
        assert_eq!(t.c_lflag & (libc::ECHO | libc::ICANON | libc::ISIG), 0, "lflag {:#x}", t.c_lflag);
        assert_eq!(t.c_oflag & libc::OPOST, 0, "oflag {:#x}", t.c_oflag);
    }
}
