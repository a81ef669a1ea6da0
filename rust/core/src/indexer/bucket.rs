//! Capacity buckets: the rounding rule that bounds the number of plans.

/// Smallest bucket >= `n`: `n` itself up to 8, then m·2^k with m in {4, 5, 6, 7}.
///
/// Monotone (a >= b implies bucket(a) >= bucket(b)), idempotent, never more
/// than 25% above `n`, and exact on powers of two.
pub const fn bucket(n: u32) -> u32 {
    if n <= 8 {
        return n;
    }
    // shift so that the top three bits of n are the mantissa (4..=7)
    let shift = 32 - n.leading_zeros() - 3;
    let unit = 1u64 << shift;
    let m = (n as u64).div_ceil(unit); // 4..=8; 8 means the next power of two
    let out = m << shift;
    if out > u32::MAX as u64 {
        u32::MAX
    } else {
        out as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_are_exact_then_four_steps_per_octave() {
        let firsts: Vec<u32> = (1..=33).map(bucket).collect();
        assert_eq!(
            firsts,
            [
                1, 2, 3, 4, 5, 6, 7, 8, 10, 10, 12, 12, 14, 14, 16, 16, 20, 20, 20, 20, 24, 24, 24,
                24, 28, 28, 28, 28, 32, 32, 32, 32, 40
            ]
        );
        assert_eq!(bucket(0), 0);
    }

    #[test]
    fn powers_of_two_and_vllm_profile_width_are_exact() {
        for k in 0..31 {
            assert_eq!(bucket(1 << k), 1 << k);
        }
        assert_eq!(bucket(65536u32.div_ceil(64)), 1024);
        assert_eq!(bucket(1025), 1280);
        assert_eq!(bucket(4096 + 64), 5120);
    }

    #[test]
    fn monotone_idempotent_and_within_a_quarter() {
        let mut prev = 0;
        for n in 1..=200_000u32 {
            let b = bucket(n);
            assert!(b >= n && b >= prev, "n={n} b={b}");
            assert_eq!(bucket(b), b);
            assert!(b as u64 * 4 <= n as u64 * 5, "n={n} b={b} wastes more than 25%");
            prev = b;
        }
    }

    #[test]
    fn bucket_count_grows_logarithmically() {
        let mut all: Vec<u32> = (1..=(1u32 << 20)).map(bucket).collect();
        all.dedup();
        assert_eq!(all.len(), 8 + 4 * 17);
    }
}
