//! The vector instruction sets charm's kernels are compiled for, detected
//! at run time. Every kernel gives the same bits on every one of them (see
//! [`crate::kernels`] and [`crate::gguf::qdot`]), so the choice changes
//! speed only.
//!
//! AMX tiles (`AMX-INT8`) are not an instruction set of their own here:
//! they serve the integer prefill products of an AVX-512 VNNI CPU
//! ([`amx_active`], `crate::gguf::qdot::amx`), every other kernel running
//! as on VNNI.

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

/// Whether this CPU runs AMX-INT8 tiles and this process may use them:
/// CPUID's `AMX-TILE` and `AMX-INT8` bits, AVX-512 VNNI (the products'
/// float part), and, on Linux, the tile state granted by
/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` (a kernel or
/// hypervisor that refuses it leaves AMX off). Asked once.
pub fn amx_runs() -> bool {
    static RUNS: OnceLock<bool> = OnceLock::new();
    *RUNS.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            // ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18.
            // SAFETY: a system call with integer arguments.
            amx_reported() && unsafe { libc::syscall(libc::SYS_arch_prctl, 0x1023, 18) } == 0
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        false
    })
}

/// Whether CPUID reports AMX-TILE and AMX-INT8 (whether or not this
/// process may use them: [`amx_runs`]).
pub fn amx_reported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID leaf 7 exists on every CPU with AVX-512 (checked first).
        Isa::Avx512Vnni.runs() && std::arch::x86_64::__cpuid_count(7, 0).edx & (3 << 24) == 3 << 24
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the integer prefill products use AMX tiles: [`amx_runs`], the
/// active instruction set is AVX-512 VNNI, and `CHARM_ISA` is unset or
/// `amx` (`CHARM_ISA=avx512vnni` runs the same products on VNNI alone).
/// Asked once.
pub fn amx_active() -> bool {
    static ACTIVE: OnceLock<bool> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        let asked = std::env::var("CHARM_ISA").map_or(true, |v| v == "amx");
        asked && Isa::active() == Isa::Avx512Vnni && amx_runs()
    })
}
