//! Background threads that must not slow decoding: the policy replays run
//! beside the model's compute threads, which on a two-core machine use
//! both cores, and at normal priority a replay took a fifth of the CPU
//! time of a warm decode.

/// Lowers the calling thread to the lowest scheduling priority: it then
/// runs on what the compute threads leave idle (waiting on drives, between
/// steps). Failure leaves the priority as it was, which is only slower.
pub(crate) fn lowest_priority() {
    crate::platform::lower_thread_priority();
}
