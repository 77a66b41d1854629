//! GGML weight types charm reads from GGUF files, and their block layouts.
//!
//! A quantized row is a sequence of blocks; each block stores `block_elems`
//! consecutive elements in `block_bytes` bytes. The layouts below are
//! ggml's (`ggml-common.h`), every multi-byte field little-endian; the
//! arithmetic that turns a block into f32 values is in [`super::dequant`].
//! Block structs hold only byte arrays (alignment 1), so a block can be
//! viewed in place at any address of a memory-mapped file.

use std::fmt;

/// A GGML tensor type charm computes with. Ids are ggml's (`enum ggml_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
    MXFP4,
}

/// Elements per K-quant super-block (`QK_K`).
pub const QK_K: usize = 256;
/// Elements per legacy block (`QK4_0`, `QK4_1`, `QK5_0`, `QK5_1`, `QK8_0`),
/// per IQ4_NL block (`QK4_NL`) and per MXFP4 block (`QK_MXFP4`).
pub const QK: usize = 32;

impl GgmlType {
    /// Every supported type, in ggml id order of their families.
    pub const ALL: [GgmlType; 16] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
        GgmlType::MXFP4,
    ];

    /// The type with ggml id `id`, or `None` when charm does not read it
    /// (see [`ggml_type_name`] for the name of a known but unsupported id).
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2_K,
            11 => GgmlType::Q3_K,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            20 => GgmlType::IQ4_NL,
            23 => GgmlType::IQ4_XS,
            30 => GgmlType::BF16,
            39 => GgmlType::MXFP4,
            _ => return None,
        })
    }

    /// ggml's id for this type.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::IQ4_NL => 20,
            GgmlType::IQ4_XS => 23,
            GgmlType::BF16 => 30,
            GgmlType::MXFP4 => 39,
        }
    }

    /// ggml's spelling: `F32`, `Q4_K`, ...
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::IQ4_NL => "IQ4_NL",
            GgmlType::IQ4_XS => "IQ4_XS",
            GgmlType::MXFP4 => "MXFP4",
        }
    }

    /// Elements per block (1 for the float types).
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::IQ4_NL
            | GgmlType::MXFP4 => QK,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::IQ4_XS => {
                QK_K
            }
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => size_of::<BlockQ4_0>(),
            GgmlType::Q4_1 => size_of::<BlockQ4_1>(),
            GgmlType::Q5_0 => size_of::<BlockQ5_0>(),
            GgmlType::Q5_1 => size_of::<BlockQ5_1>(),
            GgmlType::Q8_0 => size_of::<BlockQ8_0>(),
            GgmlType::Q2_K => size_of::<BlockQ2K>(),
            GgmlType::Q3_K => size_of::<BlockQ3K>(),
            GgmlType::Q4_K => size_of::<BlockQ4K>(),
            GgmlType::Q5_K => size_of::<BlockQ5K>(),
            GgmlType::Q6_K => size_of::<BlockQ6K>(),
            GgmlType::IQ4_NL => size_of::<BlockIq4Nl>(),
            GgmlType::IQ4_XS => size_of::<BlockIq4Xs>(),
            GgmlType::MXFP4 => size_of::<BlockMxfp4>(),
        }
    }

    /// Bytes of a row of `cols` elements, or `None` when `cols` is not a
    /// whole number of blocks or the size overflows `usize`.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        if !cols.is_multiple_of(self.block_elems()) {
            return None;
        }
        (cols / self.block_elems()).checked_mul(self.block_bytes())
    }

    /// Whether this is a block-quantized type (not F32, F16 or BF16).
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// ggml's name for any type id it defines (supported by charm or not), for
/// error messages: `Some("IQ2_XXS")` for 16, `None` for an id ggml does not
/// know.
pub fn ggml_type_name(id: u32) -> Option<&'static str> {
    if let Some(t) = GgmlType::from_id(id) {
        return Some(t.name());
    }
    Some(match id {
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        40 => "NVFP4",
        41 => "Q1_0",
        // 4, 5 (Q4_2, Q4_3) and 31..=33 (Q4_0_4_4, ...) were removed from ggml.
        4 => "Q4_2 (removed from ggml)",
        5 => "Q4_3 (removed from ggml)",
        31..=33 => "Q4_0_N_M (removed from ggml; repack to Q4_0)",
        36..=38 => "IQ4_NL_N_M (removed from ggml; repack to IQ4_NL)",
        _ => return None,
    })
}

/// Declares a block struct of byte arrays and its size assertion.
macro_rules! block {
    ($(#[$doc:meta])* $name:ident, $size:expr, { $($(#[$fdoc:meta])* $field:ident: [u8; $n:expr]),* $(,)? }) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug)]
        pub struct $name {
            $($(#[$fdoc])* pub $field: [u8; $n]),*
        }
        const _: () = assert!(size_of::<$name>() == $size);
        const _: () = assert!(align_of::<$name>() == 1);
        // SAFETY: `repr(C)` of byte arrays only: alignment 1, no padding
        // (the size assertion above), every bit pattern valid.
        unsafe impl bytemuck::Zeroable for $name {}
        // SAFETY: as above.
        unsafe impl bytemuck::Pod for $name {}
    };
}

block!(
    /// Q4_0, 32 elements: element `j < 16` is the low nibble of `qs[j]`,
    /// element `j + 16` its high nibble; value `(nibble - 8) * d`.
    BlockQ4_0, 18, {
        /// f16 scale.
        d: [u8; 2],
        qs: [u8; 16],
    }
);

block!(
    /// Q4_1, 32 elements, nibbles as Q4_0; value `nibble * d + m`.
    BlockQ4_1, 20, {
        /// f16 scale.
        d: [u8; 2],
        /// f16 minimum.
        m: [u8; 2],
        qs: [u8; 16],
    }
);

block!(
    /// Q5_0, 32 elements: low 4 bits as Q4_0's nibbles, bit 4 of element
    /// `j` is bit `j` of the little-endian u32 `qh`; value `(q - 16) * d`.
    BlockQ5_0, 22, {
        /// f16 scale.
        d: [u8; 2],
        qh: [u8; 4],
        qs: [u8; 16],
    }
);

block!(
    /// Q5_1, 32 elements, 5-bit codes as Q5_0; value `q * d + m`.
    BlockQ5_1, 24, {
        /// f16 scale.
        d: [u8; 2],
        /// f16 minimum.
        m: [u8; 2],
        qh: [u8; 4],
        qs: [u8; 16],
    }
);

block!(
    /// Q8_0, 32 elements: value `qs[j] as i8 * d`.
    BlockQ8_0, 34, {
        /// f16 scale.
        d: [u8; 2],
        qs: [u8; 32],
    }
);

block!(
    /// Q2_K, 256 elements in 16 groups of 16 with 4-bit scales and mins
    /// (`scales[g]`: scale in the low nibble, min in the high). Element `e`
    /// is bits `2j..2j + 2` of `qs[32n + e % 32]` (`n = e / 128`, `j = (e /
    /// 32) % 4`), group `e / 16`; value `(d * sc) * q - (dmin * m)`.
    BlockQ2K, 84, {
        scales: [u8; 16],
        qs: [u8; 64],
        /// f16 super-block scale of the scales.
        d: [u8; 2],
        /// f16 super-block scale of the mins.
        dmin: [u8; 2],
    }
);

block!(
    /// Q3_K, 256 elements in 16 groups of 16 with 6-bit scales
    /// ([`q3_k_scale`]). Element `e` has its low two bits laid out as
    /// Q2_K's and its third bit in bit `e / 32` of `hmask[e % 32]`; the
    /// code is `low - 4` where that bit is clear and `low` where it is set,
    /// so -4..=3; value `(d * (sc - 32)) * code`.
    BlockQ3K, 110, {
        hmask: [u8; 32],
        qs: [u8; 64],
        scales: [u8; 12],
        /// f16 super-block scale.
        d: [u8; 2],
    }
);

block!(
    /// Q4_K, 256 elements in 8 sub-blocks of 32 with 6-bit scales and mins
    /// ([`scale_min_k4`]). Sub-block `2i` is the low nibbles of
    /// `qs[32i..32i + 32]`, sub-block `2i + 1` their high nibbles; value
    /// `(d * sc) * q - (dmin * m)`.
    BlockQ4K, 144, {
        /// f16 super-block scale of the scales.
        d: [u8; 2],
        /// f16 super-block scale of the mins.
        dmin: [u8; 2],
        scales: [u8; 12],
        qs: [u8; 128],
    }
);

block!(
    /// Q5_K, 256 elements: Q4_K's nibbles and scales, plus bit 4 of element
    /// `l` of sub-block `j` in bit `j` of `qh[l]`.
    BlockQ5K, 176, {
        /// f16 super-block scale of the scales.
        d: [u8; 2],
        /// f16 super-block scale of the mins.
        dmin: [u8; 2],
        scales: [u8; 12],
        qh: [u8; 32],
        qs: [u8; 128],
    }
);

block!(
    /// Q6_K, 256 elements in two halves of 128; in half `h`, element
    /// `32k + l` (`k < 4`, `l < 32`) has low 4 bits from `ql[64h + l + 32 (k & 1)]`
    /// (low nibble for `k < 2`, high for `k >= 2`) and high 2 bits
    /// `(qh[32h + l] >> 2k) & 3`; 16 signed 8-bit scales, one per 16
    /// elements; value `(d * scales[i / 16]) * (q - 32)`.
    BlockQ6K, 210, {
        ql: [u8; 128],
        qh: [u8; 64],
        /// i8 scales.
        scales: [u8; 16],
        /// f16 super-block scale.
        d: [u8; 2],
    }
);

block!(
    /// IQ4_NL, 32 elements: nibbles as Q4_0's (element `j < 16` the low
    /// nibble of `qs[j]`, `j + 16` its high nibble), each naming one of
    /// sixteen non-uniform levels; value `d * kvalues_iq4nl[nibble]`
    /// ([`KVALUES_IQ4NL`]).
    BlockIq4Nl, 18, {
        /// f16 scale.
        d: [u8; 2],
        qs: [u8; 16],
    }
);

block!(
    /// IQ4_XS, 256 elements in 8 sub-blocks of 32 with 6-bit scales
    /// ([`iq4_xs_scale`]); sub-block `b`'s nibbles are `qs[16b..16b + 16]`
    /// in IQ4_NL's order; value `(d * (ls - 32)) * kvalues_iq4nl[nibble]`.
    BlockIq4Xs, 136, {
        /// f16 super-block scale.
        d: [u8; 2],
        /// Little-endian u16: the top two bits of sub-block `b`'s scale at
        /// bits `2b..2b + 2`.
        scales_h: [u8; 2],
        /// The low four bits of sub-block `b`'s scale: the low nibble of
        /// byte `b / 2` for even `b`, the high nibble for odd `b`.
        scales_l: [u8; 4],
        qs: [u8; 128],
    }
);

block!(
    /// MXFP4 (OCP microscaling FP4), 32 elements: an E8M0 exponent `e` and
    /// 4-bit codes, element `j < 16` the low nibble of `qs[j]`, element
    /// `j + 16` its high nibble (as Q4_0); value
    /// `kvalues_mxfp4[nibble] * 2^(e - 128)` ([`KVALUES_MXFP4`],
    /// [`e8m0_to_f32_half`]).
    BlockMxfp4, 17, {
        /// E8M0 shared exponent.
        e: [u8; 1],
        qs: [u8; 16],
    }
);

/// MXFP4's code values (`kvalues_mxfp4` in ggml): the FP4 E2M1 values
/// `±{0, 0.5, 1, 1.5, 2, 3, 4, 6}` doubled, so they are integers; bit 3 of
/// the code is the sign (code 8, E2M1's -0, is plain 0 here). The doubling
/// is undone by the scale, [`e8m0_to_f32_half`].
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// The signed scale `sc - 32` of group `g` (0..16, 16 elements each) of a
/// Q3_K block from its twelve scale bytes: the low four bits are the low
/// (`g < 8`) or high (`g >= 8`) nibble of byte `g % 8`, the top two bits
/// `(scales[8 + g % 4] >> 2 (g / 4)) & 3`.
#[inline(always)]
pub fn q3_k_scale(scales: &[u8], g: usize) -> i32 {
    let low = (scales[g % 8] >> (4 * (g / 8))) & 0x0f;
    let high = (scales[8 + g % 4] >> (2 * (g / 4))) & 3;
    (low | (high << 4)) as i32 - 32
}

/// IQ4_NL's and IQ4_XS's sixteen levels (`kvalues_iq4nl` in ggml), a
/// non-uniform 4-bit grid scaled by the block's `d`.
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// The signed scale `ls - 32` of sub-block `b` (0..8) of an IQ4_XS block
/// (`scales_h`, `scales_l` its fields): `ls = ((scales_l[b / 2] >> 4 (b %
/// 2)) & 0xf) | (((scales_h >> 2b) & 3) << 4)`, 0..=63.
#[inline(always)]
pub fn iq4_xs_scale(scales_h: [u8; 2], scales_l: &[u8], b: usize) -> i32 {
    let h = u16::from_le_bytes(scales_h);
    let ls = ((scales_l[b / 2] >> (4 * (b % 2))) & 0x0f) as i32 | ((((h >> (2 * b)) & 3) as i32) << 4);
    ls - 32
}

/// Half the value of an E8M0 exponent byte, `2^(e - 128)`, exactly (ggml's
/// `GGML_E8M0_TO_FP32_HALF`; every byte is a finite power of two, 255
/// included). For `e >= 2` the f32 is normal and `e - 1` is its biased
/// exponent; `e = 1` and `e = 0` give the subnormals `2^-127` and
/// `2^-128`.
#[inline(always)]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    // if (x < 2) bits = 0x00200000 << x; else bits = (uint32_t)(x - 1) << 23;
    let e = e as u32;
    f32::from_bits(if e < 2 { 0x0020_0000 << e } else { (e - 1) << 23 })
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K block
/// (`get_scale_min_k4` in ggml): bytes 0..4 hold the low 6 bits of scales
/// 0..4, bytes 4..8 those of mins 0..4, and bytes 8..12 the low 4 bits of
/// scale (low nibble) and min (high nibble) 4..8, whose top 2 bits are the
/// top 2 bits of bytes 0..4 (scales) and 4..8 (mins).
#[inline(always)]
pub fn scale_min_k4(scales: &[u8; 12], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 0x3f, scales[j + 4] & 0x3f)
    } else {
        let sc = (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4);
        let m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
        (sc, m)
    }
}

/// IEEE half-precision bits to f32, exactly, keeping a NaN's payload and
/// quiet bit as they are (as numpy's `float16 -> float32` cast does; the
/// `half` crate sets the quiet bit). Branch-free: a normal value's exponent
/// is rebiased by an integer add, a subnormal's mantissa (`em < 0x400`) is
/// converted and scaled by 2^-24, both exact. (Moving the bits into an f32
/// subnormal and multiplying by 2^112 gives the same values, but x86 takes
/// a microcode assist of ~150 cycles for every subnormal operand: a third
/// of an AMX prefill decoding rows with tiny f16 scales.)
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let em = (h & 0x7fff) as u32;
    let normal = (em << 13) + (112 << 23);
    let subnormal = (em as f32 * f32::from_bits(0x3380_0000)).to_bits(); // * 2^-24
    let special = 0x7f80_0000 | (em << 13); // infinity or NaN, payload kept
    let finite = if em < 0x400 { subnormal } else { normal };
    f32::from_bits(sign | if em >= 0x7c00 { special } else { finite })
}

/// A little-endian f16 field as f32.
#[inline(always)]
pub fn f16_le(b: [u8; 2]) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_sizes_match_ggml() {
        // (type, id, block elems, block bytes) from ggml's type traits.
        let table = [
            (GgmlType::F32, 0, 1, 4),
            (GgmlType::F16, 1, 1, 2),
            (GgmlType::Q4_0, 2, 32, 18),
            (GgmlType::Q4_1, 3, 32, 20),
            (GgmlType::Q5_0, 6, 32, 22),
            (GgmlType::Q5_1, 7, 32, 24),
            (GgmlType::Q8_0, 8, 32, 34),
            (GgmlType::Q2_K, 10, 256, 84),
            (GgmlType::Q3_K, 11, 256, 110),
            (GgmlType::Q4_K, 12, 256, 144),
            (GgmlType::Q5_K, 13, 256, 176),
            (GgmlType::Q6_K, 14, 256, 210),
            (GgmlType::IQ4_NL, 20, 32, 18),
            (GgmlType::IQ4_XS, 23, 256, 136),
            (GgmlType::BF16, 30, 1, 2),
            (GgmlType::MXFP4, 39, 32, 17),
        ];
        for (t, id, elems, bytes) in table {
            assert_eq!(t.id(), id);
            assert_eq!(GgmlType::from_id(id), Some(t));
            assert_eq!(t.block_elems(), elems);
            assert_eq!(t.block_bytes(), bytes);
            assert_eq!(ggml_type_name(id), Some(t.name()));
            assert_eq!(t.to_string(), t.name());
        }
        assert_eq!(GgmlType::ALL.len(), table.len());
        for id in [4, 5, 9, 15, 16, 18, 29, 31, 40, 41, 42, 1000, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None, "id {id}");
        }
        assert_eq!(ggml_type_name(18), Some("IQ3_XXS"));
        assert_eq!(ggml_type_name(42), None);
    }

    #[test]
    fn e8m0_halves_are_exact_powers_of_two() {
        for e in 0..=255u8 {
            let want = 2f64.powi(e as i32 - 128) as f32;
            assert_eq!(e8m0_to_f32_half(e).to_bits(), want.to_bits(), "e = {e}");
        }
        assert_eq!(e8m0_to_f32_half(0).to_bits(), 0x0020_0000);
        assert_eq!(e8m0_to_f32_half(1).to_bits(), 0x0040_0000);
        assert_eq!(e8m0_to_f32_half(2), f32::MIN_POSITIVE);
        assert_eq!(e8m0_to_f32_half(128), 1.0);
        assert_eq!(e8m0_to_f32_half(255), 2f32.powi(127));
    }

    #[test]
    fn row_bytes_needs_whole_blocks() {
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(100), None);
        assert_eq!(GgmlType::Q8_0.row_bytes(64), Some(68));
        assert_eq!(GgmlType::F32.row_bytes(3), Some(12));
        assert_eq!(GgmlType::F32.row_bytes(usize::MAX), None);
        assert_eq!(GgmlType::Q4_0.row_bytes(0), Some(0));
        assert_eq!(GgmlType::MXFP4.row_bytes(2880), Some(90 * 17));
        assert_eq!(GgmlType::MXFP4.row_bytes(48), None);
    }

    #[test]
    fn f16_conversion_is_exact_and_keeps_nan_payloads() {
        for h in 0..=u16::MAX {
            let ours = f16_bits_to_f32(h);
            let theirs = half::f16::from_bits(h).to_f32();
            if theirs.is_nan() {
                assert!(ours.is_nan());
                // numpy keeps the payload exactly, quiet bit included.
                let e = ((h & 0x8000) as u32) << 16 | 0x7f80_0000 | ((h & 0x3ff) as u32) << 13;
                assert_eq!(ours.to_bits(), e, "{h:#x}");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{h:#x}");
            }
        }
    }

    #[test]
    fn k4_scales_unpack_as_ggml() {
        // Scales 0..8 = 1, 2, ..., 8 with top bits set on 4..8 via bytes 0..4;
        // build it from the definition and read it back.
        let (sc, m): ([u8; 8], [u8; 8]) = ([1, 2, 3, 63, 17, 40, 0, 63], [5, 0, 62, 9, 33, 1, 63, 48]);
        let mut s = [0u8; 12];
        for j in 0..4 {
            s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            s[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
            s[j + 8] = (sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4);
        }
        for j in 0..8 {
            assert_eq!(scale_min_k4(&s, j), (sc[j], m[j]), "sub-block {j}");
        }
    }
}
