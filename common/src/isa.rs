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
    /// x86-64 AVX2.
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
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512vnni",
        }
    }

    /// Every instruction set this CPU can run, the portable one first.
    pub fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                v.push(Isa::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512vnni")
            {
                v.push(Isa::Avx512Vnni);
            }
        }
        #[cfg(target_arch = "aarch64")]
        v.push(Isa::Neon);
        v
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
                Ok(name) => avail.into_iter().find(|i| i.name() == name).unwrap_or(best),
                Err(_) => best,
            }
        })
    }
}
