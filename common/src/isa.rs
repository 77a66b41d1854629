//! The vector instruction sets charm's kernels are compiled for, detected
//! at run time. Every kernel gives the same bits on every one of them (see
//! [`crate::kernels`] and [`crate::gguf::qdot`]), so the choice changes
//! speed only.

use std::sync::OnceLock;

/// A family of vector instructions a kernel is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust, no explicit vector code.
    Scalar,
    /// AArch64 Advanced SIMD.
    Neon,
    /// AArch64 Advanced SIMD with the dot-product instructions (`sdot`;
    /// ARMv8.2's `dotprod`, every Apple M-series core).
    NeonDot,
    /// x86-64 AVX2 (with F16C and FMA).
    Avx2,
    /// x86-64 AVX-512 (F, BW, VL) with VNNI.
    Avx512Vnni,
}

impl Isa {
    /// Its name, as `CHARM_ISA` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Neon => "neon",
            Isa::NeonDot => "neondot",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512vnni",
        }
    }

    /// Every instruction set this CPU can run, the portable one first
    /// (detected once).
    pub fn available() -> &'static [Isa] {
        static AVAILABLE: OnceLock<Vec<Isa>> = OnceLock::new();
        AVAILABLE.get_or_init(|| {
            let mut v = vec![Isa::Scalar];
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::is_x86_feature_detected as has;
                // The float kernels fuse every multiply-add (`vfmadd`).
                if has!("avx2") && has!("f16c") && has!("fma") {
                    v.push(Isa::Avx2);
                    if has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni") {
                        v.push(Isa::Avx512Vnni);
                    }
                }
            }
            #[cfg(target_arch = "aarch64")]
            {
                v.push(Isa::Neon);
                if std::arch::is_aarch64_feature_detected!("dotprod") {
                    v.push(Isa::NeonDot);
                }
            }
            v
        })
    }

    /// Whether this CPU runs `self`.
    #[inline]
    pub fn runs(self) -> bool {
        Isa::available().contains(&self)
    }

    /// The instruction set the kernels use: the best this CPU runs, or the
    /// one named by the environment variable `CHARM_ISA` when this CPU runs
    /// it (benchmarks and tests compare paths with it; results are the same
    /// bits either way). Detected once.
    pub fn active() -> Isa {
        static ACTIVE: OnceLock<Isa> = OnceLock::new();
        *ACTIVE.get_or_init(|| {
            let avail = Isa::available();
            let best = *avail.last().unwrap_or(&Isa::Scalar);
            match std::env::var("CHARM_ISA") {
                Ok(name) => avail.iter().copied().find(|i| i.name() == name).unwrap_or(best),
                Err(_) => best,
            }
        })
    }
}
