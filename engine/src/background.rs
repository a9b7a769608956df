//! Background threads that must not slow decoding: the policy replays run
//! beside the model's compute threads, which on a two-core machine use
//! both cores, and at normal priority a replay took a fifth of the CPU
//! time of a warm decode.

/// Lowers the calling thread to the lowest scheduling priority: it then
/// runs on what the compute threads leave idle (waiting on drives, between
/// steps). Failure leaves the priority as it was, which is only slower.
pub(crate) fn lowest_priority() {
    #[cfg(target_os = "linux")]
    {
        /// The weakest nice value: a weight of 15 against 1024 at nice 0.
        const NICEST: libc::c_int = 19;
        // SAFETY: plain system calls on the calling thread (on Linux, a
        // thread's priority is its own).
        unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICEST);
        }
    }
    #[cfg(target_os = "macos")]
    {
        // SAFETY: sets the calling thread's own quality of service.
        unsafe {
            libc::pthread_set_qos_class_self_np(libc::qos_class_t::QOS_CLASS_UTILITY, 0);
        }
    }
}
