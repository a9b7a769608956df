//! How much memory the process may use, and what the kernel reports about
//! its use: the limit a budget is planned against, and the signs (reclaim
//! passes, major faults) that a run pressed on it.
//!
//! The limit is the smaller of physical memory and, on Linux, the memory
//! cgroup's limit, which counts the page cache too: reading through the page
//! cache under a limit makes the kernel reclaim pages all the time, which is
//! why expert reads bypass it.

/// Share of physical memory taken as the limit when no cgroup sets one: the
/// rest is the operating system's and the other applications'.
pub const PHYSICAL_SHARE: f64 = 0.75;
/// Memory the process needs besides weights, caches and read buffers when
/// the model's widths are not at hand (the queue's forecasts): code,
/// tokenizer, thread stacks, activations, allocator slack.
pub const RUNTIME_BYTES: u64 = 128 << 20;
/// The part of the runtime that does not grow with a pass's rows: code,
/// tokenizer, thread stacks, the readers' restore buffers, allocator slack.
/// Measured as peak RSS − resident weights − record buffers' peak with a
/// 16-token prompt: 51 MiB on a DeepSeek-V3-shaped pack (2 drives), 57 MiB
/// on the peers' Qwen3-MoE (2 drives) and 65–73 MiB on it over 4 drives
/// (more reader threads), where the rows add 3–12 MiB.
pub const RUNTIME_FIXED_BYTES: u64 = 72 << 20;
/// Activations one row of a pass may hold at once, in f32 widths of the
/// hidden size (residual, norms, attention projections and scores, the
/// experts' inputs and outputs) and of the expert intermediate size (gate,
/// up and activation for each of up to 16 routed experts). Measured per row
/// between 16- and 512-token prompts: 170 KB on the peers' Qwen3-MoE
/// (hidden 1024, intermediate 512), 136 KB on a DeepSeek-V3-shaped pack of
/// the same widths; these widths give 196 KB.
pub const ROW_HIDDEN_WIDTHS: u64 = 24;
/// See [`ROW_HIDDEN_WIDTHS`]: three for each of up to 16 routed experts.
pub const ROW_INTERMEDIATE_WIDTHS: u64 = 48;

/// The runtime for passes of up to `rows` rows of a model `hidden` wide
/// whose experts are `intermediate` wide: the fixed part plus the rows'
/// activations. A 512-row prompt chunk of the peers' model measured 137 MiB
/// (planned: 170); its 64-token bench context, 65–73 MiB (planned: 84).
pub fn runtime_bytes(rows: u64, hidden: u64, intermediate: u64) -> u64 {
    let row = std::mem::size_of::<f32>() as u64
        * (ROW_HIDDEN_WIDTHS * hidden + ROW_INTERMEDIATE_WIDTHS * intermediate);
    RUNTIME_FIXED_BYTES + rows * row
}

/// Share of the limit left unused, so the kernel never has to take the
/// process's own pages back.
pub const HEADROOM_SHARE: f64 = 0.03;
/// The attention cache grows by appending, which briefly holds the old and
/// the new copy.
pub const KV_COPIES: u64 = 2;

/// The default limit: a share of physical memory, as the system lets this
/// process have it (on Linux the cgroup's limit when one is set: the page
/// cache counts against it, and expert reads bypass the page cache; on
/// macOS no more than the VM reports free and reclaimable).
pub fn default_limit_bytes() -> Option<u64> {
    crate::platform::plan_limit(physical_bytes().map(|p| (p as f64 * PHYSICAL_SHARE) as u64))
}

/// A memory limit to plan a model's budget against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySettings {
    pub limit_bytes: u64,
    /// Positions of attention cache to leave room for.
    pub context_tokens: u64,
    /// The budget in the streaming options was chosen by hand: check that it
    /// fits instead of replacing it.
    pub budget_given: bool,
}

/// How a memory limit is spent: weights that stay in RAM, the attention
/// cache for a context, buffers for records read for one use, the runtime,
/// headroom, and what is left for cached experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MemoryPlan {
    pub limit_bytes: u64,
    pub resident_bytes: u64,
    pub context_tokens: u64,
    pub kv_bytes: u64,
    pub window_bytes: u64,
    pub runtime_bytes: u64,
    pub headroom_bytes: u64,
    /// RAM for prompt state kept for later prompts (the prefix cache's RAM
    /// tier), which the process shares by every model it loads.
    pub prefix_bytes: u64,
    /// The largest expert budget that fits.
    pub budget_bytes: u64,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum MemoryError {
    #[error(
        "a memory limit of {} leaves no room for experts: resident weights take {}, the sequence state for {} tokens {}, read buffers {}, the prefix cache {}, the runtime {} and headroom {}; raise the limit to at least {}",
        mib(plan.limit_bytes), mib(plan.resident_bytes), plan.context_tokens, mib(plan.kv_bytes),
        mib(plan.window_bytes), mib(plan.prefix_bytes), mib(plan.runtime_bytes), mib(plan.headroom_bytes), mib(*needed)
    )]
    TooSmall { plan: MemoryPlan, needed: u64 },
    #[error(
        "an expert budget of {} does not fit in a memory limit of {}: at most {} is left after resident weights ({}), the sequence state ({}), read buffers ({}), the prefix cache ({}), the runtime ({}) and headroom ({})",
        mib(*budget), mib(plan.limit_bytes), mib(plan.budget_bytes), mib(plan.resident_bytes),
        mib(plan.kv_bytes), mib(plan.window_bytes), mib(plan.prefix_bytes), mib(plan.runtime_bytes), mib(plan.headroom_bytes)
    )]
    BudgetTooLarge { budget: u64, plan: MemoryPlan },
    #[error(
        "its weights take {} in RAM, more than the {} this process may use (physical memory or its memory limit); pack it (`longhaul pack`) to stream its experts from drives",
        mib(*bytes), mib(*limit)
    )]
    CheckpointTooLarge { bytes: u64, limit: u64 },
}

/// Refuses to load `bytes` of weights into RAM under `limit`, before a byte
/// is read: an allocation that fails aborts the process.
pub fn check_fits(bytes: u64, limit: Option<u64>) -> Result<(), MemoryError> {
    match limit {
        Some(limit) if bytes > limit => Err(MemoryError::CheckpointTooLarge { bytes, limit }),
        _ => Ok(()),
    }
}

/// What a sequence's state takes: bytes per position (attention caches)
/// and bytes whatever the length (recurrent layers' state and windows,
/// with the copies kept for cutting back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StateBytes {
    pub per_token: u64,
    pub fixed: u64,
}

impl StateBytes {
    pub fn per_token(per_token: u64) -> Self {
        Self {
            per_token,
            fixed: 0,
        }
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1u64 << 20) as f64)
}

impl MemoryPlan {
    /// Spends `limit_bytes` on a model whose non-expert weights take
    /// `resident_bytes`, for `context_tokens` positions of sequence state
    /// sized by `state`, with `window_bytes` of one-use read buffers,
    /// `prefix_bytes` of cached prompt state and `runtime_bytes` for the
    /// rest (see [`runtime_bytes`]). The smallest useful budget is
    /// one expert of `min_expert_bytes`.
    pub fn new(
        limit_bytes: u64,
        resident_bytes: u64,
        context_tokens: u64,
        state: StateBytes,
        (window_bytes, prefix_bytes, runtime_bytes): (u64, u64, u64),
        min_expert_bytes: u64,
    ) -> Result<Self, MemoryError> {
        let mut plan = Self {
            limit_bytes,
            resident_bytes,
            context_tokens,
            kv_bytes: (context_tokens * state.per_token + state.fixed) * KV_COPIES,
            window_bytes,
            runtime_bytes,
            headroom_bytes: (limit_bytes as f64 * HEADROOM_SHARE) as u64,
            prefix_bytes,
            budget_bytes: 0,
        };
        let fixed = plan.resident_bytes
            + plan.kv_bytes
            + plan.window_bytes
            + plan.prefix_bytes
            + plan.runtime_bytes
            + plan.headroom_bytes;
        if limit_bytes < fixed + min_expert_bytes {
            return Err(MemoryError::TooSmall {
                plan,
                needed: ((fixed - plan.headroom_bytes + min_expert_bytes) as f64
                    / (1.0 - HEADROOM_SHARE))
                    .ceil() as u64
                    + 1,
            });
        }
        plan.budget_bytes = limit_bytes - fixed;
        Ok(plan)
    }

    /// Checks that an expert budget chosen by hand fits.
    pub fn check(&self, budget: u64) -> Result<(), MemoryError> {
        if budget > self.budget_bytes {
            return Err(MemoryError::BudgetTooLarge {
                budget,
                plan: *self,
            });
        }
        Ok(())
    }
}

impl std::fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "memory limit {}: resident weights {}, attention cache {} ({} tokens), read buffers {}, prefix cache {}, runtime {}, headroom {}, experts up to {}",
            mib(self.limit_bytes),
            mib(self.resident_bytes),
            mib(self.kv_bytes),
            self.context_tokens,
            mib(self.window_bytes),
            mib(self.prefix_bytes),
            mib(self.runtime_bytes),
            mib(self.headroom_bytes),
            mib(self.budget_bytes)
        )
    }
}

/// Bytes of physical memory, if the system says.
pub fn physical_bytes() -> Option<u64> {
    crate::platform::physical_bytes()
}

/// The bound the system sets on this process's memory beyond physical
/// memory, if any (on Linux the memory cgroup's limit, page cache
/// included; macOS sets none).
pub fn bound_bytes() -> Option<u64> {
    crate::platform::memory_bound_bytes()
}

/// Times the bound was reached (each one a reclaim pass), if known.
pub fn bound_hits() -> Option<u64> {
    crate::platform::memory_bound_hits()
}

/// What the process may use: the smaller of physical memory and its bound.
pub fn available_limit_bytes() -> Option<u64> {
    match (physical_bytes(), bound_bytes()) {
        (Some(p), Some(c)) => Some(p.min(c)),
        (p, c) => p.or(c),
    }
}

/// Major page faults and peak resident set size of this process so far.
pub fn usage() -> ProcessUsage {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage.
    let ok = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } == 0;
    if !ok {
        return ProcessUsage::default();
    }
    ProcessUsage {
        major_faults: Some(u.ru_majflt as u64),
        peak_rss_bytes: Some(u.ru_maxrss as u64 * crate::platform::PEAK_RSS_UNIT),
    }
}

#[derive(Debug, Clone, Copy, Default, serde::Serialize, PartialEq, Eq)]
pub struct ProcessUsage {
    pub major_faults: Option<u64>,
    pub peak_rss_bytes: Option<u64>,
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_checkpoint_larger_than_the_machine_is_refused_by_size() {
        assert!(super::check_fits(10, Some(10)).is_ok());
        assert!(super::check_fits(10, None).is_ok());
        let err = super::check_fits(11 << 30, Some(8 << 30))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("11264 MiB") && err.contains("8192 MiB") && err.contains("longhaul pack"),
            "{err}"
        );
    }

    use super::*;

    #[test]
    fn a_plan_spends_the_limit_and_says_what_does_not_fit() {
        let gib = 1u64 << 30;
        let plan = MemoryPlan::new(
            2 * gib,
            264 << 20,
            64,
            StateBytes::per_token(49152),
            (64 << 20, 16 << 20, RUNTIME_BYTES),
            3 << 20,
        )
        .unwrap();
        let spent = plan.resident_bytes
            + plan.kv_bytes
            + plan.window_bytes
            + plan.prefix_bytes
            + plan.runtime_bytes
            + plan.headroom_bytes
            + plan.budget_bytes;
        assert_eq!(spent, plan.limit_bytes);
        assert!(plan.budget_bytes > 1500 << 20);
        assert!(plan.check(plan.budget_bytes).is_ok());
        let too_big = plan.check(plan.budget_bytes + 1).unwrap_err().to_string();
        assert!(too_big.contains("does not fit"), "{too_big}");
        let err = MemoryPlan::new(
            300 << 20,
            264 << 20,
            64,
            StateBytes::per_token(49152),
            (64 << 20, 16 << 20, RUNTIME_BYTES),
            3 << 20,
        )
        .unwrap_err();
        let MemoryError::TooSmall { needed, .. } = err.clone() else {
            panic!("{err}")
        };
        assert!(
            err.to_string().contains("resident weights take 264 MiB"),
            "{err}"
        );
        assert!(
            MemoryPlan::new(
                needed,
                264 << 20,
                64,
                StateBytes::per_token(49152),
                (64 << 20, 16 << 20, RUNTIME_BYTES),
                3 << 20
            )
            .is_ok()
        );
    }

    #[test]
    fn the_runtime_covers_what_was_measured_and_grows_with_the_rows() {
        let mib = |b: u64| b >> 20;
        // The peers' Qwen3-MoE (hidden 1024, experts 512 wide): 65–73 MiB in a
        // 64-token context over 4 drives, 137 MiB with 512-row prompt chunks.
        assert!(mib(runtime_bytes(64, 1024, 512)) >= 73);
        assert!(mib(runtime_bytes(512, 1024, 512)) >= 137);
        assert!(runtime_bytes(1, 7168, 2048) < runtime_bytes(512, 7168, 2048));
    }

    #[test]
    fn the_machine_has_memory_and_the_process_uses_some() {
        let limit = available_limit_bytes().unwrap();
        assert!(limit > 64 << 20);
        assert!(usage().peak_rss_bytes.unwrap() > 0);
    }
}
