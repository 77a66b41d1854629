//! The cache of one sequence: one entry per layer, of that layer's mixer
//! kind ([`LayerCache`]): keys and values for attention layers, conv and
//! recurrent state for gated DeltaNet layers.
//!
//! Keys are stored after RoPE. Each layer owns its own cache, so layers of
//! different kinds (full, sliding, MLA latents) keep different shapes.

use std::fmt;
use std::str::FromStr;

use charm_common::kernels::{
    add_weighted_rows, add_weighted_rows_f16, add_weighted_rows_many, add_weighted_rows_many_f16, dots_f16, dots_f32,
    scores_by_query_f16, scores_by_query_f32, scores_tile_f16, scores_tile_f32, weighted_rows_many,
    weighted_rows_many_f16,
};
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use serde::{Deserialize, Serialize};

use crate::recurrent_state::RecurrentState;

/// The element type the cache stores keys and values in. Not a placement
/// choice: it is part of what the model computes (f16 rounds every cached
/// key and value), chosen once per engine and the same on every worker
/// count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvDtype {
    /// Exact: the projections' f32 outputs (the oracle's arithmetic).
    #[default]
    F32,
    /// Half the memory and half the bytes read per decoded token; each
    /// value rounded to nearest-even f16 (llama.cpp's default cache type).
    F16,
}

impl KvDtype {
    /// Bytes per cached element.
    pub fn size(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
        })
    }
}

impl FromStr for KvDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvDtype::F32),
            "f16" => Ok(KvDtype::F16),
            _ => Err(format!("unknown KV cache type {s:?} (expected f32 or f16)")),
        }
    }
}

/// One KV head's cached rows, `len × head_dim`, in the cache's dtype.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Rows {
    F32(Vec<f32>),
    F16(Vec<u16>),
}

impl Rows {
    fn new(dtype: KvDtype) -> Self {
        match dtype {
            KvDtype::F32 => Rows::F32(Vec::new()),
            KvDtype::F16 => Rows::F16(Vec::new()),
        }
    }

    fn extend(&mut self, xs: &[f32]) {
        match self {
            Rows::F32(v) => v.extend_from_slice(xs),
            Rows::F16(v) => {
                // Round to nearest even, eight at a time where F16C runs
                // (the same bits as `f16::from_f32` per element).
                let start = v.len();
                v.resize(start + xs.len(), 0);
                v[start..]
                    .reinterpret_cast_mut::<half::f16>()
                    .convert_from_f32_slice(xs);
            }
        }
    }

    fn truncate(&mut self, n: usize) {
        match self {
            Rows::F32(v) => v.truncate(n),
            Rows::F16(v) => v.truncate(n),
        }
    }

    /// Drops the first `n` elements.
    fn drop_front(&mut self, n: usize) {
        match self {
            Rows::F32(v) => drop(v.drain(..n)),
            Rows::F16(v) => drop(v.drain(..n)),
        }
    }

    fn elements(&self) -> usize {
        match self {
            Rows::F32(v) => v.len(),
            Rows::F16(v) => v.len(),
        }
    }

    fn view(&self, from: usize, to: usize) -> CachedRows<'_> {
        match self {
            Rows::F32(v) => CachedRows::F32(&v[from..to]),
            Rows::F16(v) => CachedRows::F16(&v[from..to]),
        }
    }
}

/// A run of one KV head's cached keys or values, row-major, `head_dim`
/// wide, with the two products attention needs.
#[derive(Clone, Copy, Debug)]
pub enum CachedRows<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
}

impl CachedRows<'_> {
    /// `out[j] = rows[j] · q` (attention scores).
    pub fn dots(self, q: &[f32], out: &mut [f32]) {
        match self {
            CachedRows::F32(r) => dots_f32(r, q, out),
            CachedRows::F16(r) => dots_f16(r, q, out),
        }
    }

    /// `out[j * qs.len() + h] = rows[j] · qs[h]` for `width`-wide rows:
    /// several queries (heads sharing these rows) scored in one pass over
    /// them, each score the bits of [`CachedRows::dots`].
    pub fn dots_many(self, width: usize, qs: &[&[f32]], out: &mut [f32]) {
        match self {
            CachedRows::F32(r) => scores_tile_f32(r, width, qs, out),
            CachedRows::F16(r) => scores_tile_f16(r, width, qs, out),
        }
    }

    /// `out[h * stride + j] = rows[j] · qs[h]`: [`CachedRows::dots_many`]
    /// query-major, each query's scores in a row of its own.
    pub fn dots_by_query(self, width: usize, qs: &[&[f32]], out: &mut [f32], stride: usize) {
        match self {
            CachedRows::F32(r) => scores_by_query_f32(r, width, qs, out, stride),
            CachedRows::F16(r) => scores_by_query_f16(r, width, qs, out, stride),
        }
    }

    /// `out += Σ_j weights[j] rows[j]` (attention's weighted values).
    pub fn add_weighted(self, weights: &[f32], out: &mut [f32]) {
        match self {
            CachedRows::F32(r) => add_weighted_rows(out, weights, r),
            CachedRows::F16(r) => add_weighted_rows_f16(out, weights, r),
        }
    }

    /// `outs[h] = Σ_j weights[h][j] rows[j][..outs[h].len()]` for
    /// `stride`-wide rows: several heads' weighted values in one pass over
    /// them, each the bits of [`CachedRows::add_weighted`] into zeros.
    pub fn weighted_many(self, stride: usize, weights: &[&[f32]], outs: &mut [&mut [f32]]) {
        match self {
            CachedRows::F32(r) => weighted_rows_many(r, stride, weights, outs),
            CachedRows::F16(r) => weighted_rows_many_f16(r, stride, weights, outs),
        }
    }

    /// [`CachedRows::weighted_many`] continuing the sums in `outs`
    /// (`outs[h] += …`, each the bits of [`CachedRows::add_weighted`]):
    /// a long run of rows taken in blocks, each block's rows read once
    /// for every head.
    pub fn add_weighted_many(self, stride: usize, weights: &[&[f32]], outs: &mut [&mut [f32]]) {
        match self {
            CachedRows::F32(r) => add_weighted_rows_many(r, stride, weights, outs),
            CachedRows::F16(r) => add_weighted_rows_many_f16(r, stride, weights, outs),
        }
    }
}

/// Keys and values of one attention layer, stored head-major: per KV head,
/// `len × head_dim` keys (and values) in one contiguous run, so a head's
/// attention reads its cache front to back instead of striding across
/// every head's row (a page per position at long contexts).
///
/// A sliding-window layer (window `w`) is bounded: positions no later row
/// can see are dropped from the front ([`LayerKv::begin_step`]) once `w` of
/// them have gathered, so it holds between `w - 1` and `2w - 2` positions
/// before a step (plus the step's rows), however long the sequence. The
/// rows it keeps, and the order attention reads them in, are those of an
/// unbounded cache: the same bits.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LayerKv {
    k: Vec<Rows>,
    v: Vec<Rows>,
    head_dim: usize,
    /// Width of one head's value (MiMo-V2-Flash's `v_head_dim`; most
    /// families: `head_dim`).
    #[serde(default)]
    v_head_dim: usize,
    /// Positions seen.
    len: usize,
    dtype: KvDtype,
    /// The sliding window, when the layer has one.
    #[serde(default)]
    window: Option<usize>,
    /// The first position still held (0 until the window drops some).
    #[serde(default)]
    start: usize,
}

impl LayerKv {
    fn new(kv_heads: usize, head_dim: usize, v_head_dim: usize, dtype: KvDtype, window: Option<usize>) -> Self {
        LayerKv {
            k: (0..kv_heads).map(|_| Rows::new(dtype)).collect(),
            v: (0..kv_heads).map(|_| Rows::new(dtype)).collect(),
            head_dim,
            v_head_dim,
            len: 0,
            dtype,
            window,
            start: 0,
        }
    }

    /// The sliding window, when the layer has one.
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    /// The first position still held.
    pub fn start(&self) -> usize {
        self.start
    }

    /// Positions held now (`len - start`).
    pub fn held(&self) -> usize {
        self.len - self.start
    }

    /// Before a step appends its rows: a sliding layer drops the positions
    /// no row from `len` on can see (`pos - w + 1` is the first a row at
    /// `pos` sees) once at least `w` of them have gathered, so the cost is
    /// one move of `w - 1` rows every `w` positions.
    pub fn begin_step(&mut self) {
        let Some(w) = self.window else { return };
        let first_seen = (self.len + 1).saturating_sub(w);
        let dead = first_seen.saturating_sub(self.start);
        if dead >= w.max(1) {
            for (k, v) in self.k.iter_mut().zip(&mut self.v) {
                k.drop_front(dead * self.head_dim);
                v.drop_front(dead * self.v_head_dim);
            }
            self.start = first_seen;
        }
    }

    /// Whether the layer can be cut back to `len` positions and go on: a
    /// sliding layer needs the `w - 1` positions before `len` (an
    /// unbounded layer can always).
    fn can_cut_to(&self, len: usize) -> bool {
        match self.window {
            Some(w) => len >= self.len || self.start <= (len + 1).saturating_sub(w),
            None => true,
        }
    }

    /// Cached positions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Width of one cached key (`kv_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.k.len() * self.head_dim
    }

    /// Width of one cached value (`kv_heads * v_head_dim`).
    pub fn v_dim(&self) -> usize {
        self.v.len() * self.v_head_dim
    }

    /// The element type keys and values are stored in.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Appends one position's key and value rows (`kv_dim` and `v_dim`,
    /// head after head, as the projections produce them), rounded to the
    /// cache's dtype.
    pub fn push(&mut self, k: &[f32], v: &[f32]) {
        let (hd, vd) = (self.head_dim, self.v_head_dim);
        debug_assert_eq!((k.len(), v.len()), (self.kv_dim(), self.v_dim()));
        for (h, (kh, vh)) in k.chunks_exact(hd).zip(v.chunks_exact(vd)).enumerate() {
            self.k[h].extend(kh);
            self.v[h].extend(vh);
        }
        self.len += 1;
    }

    /// KV head `h`'s keys of positions `from..to` (at or after [`LayerKv::start`]).
    pub fn keys(&self, h: usize, from: usize, to: usize) -> CachedRows<'_> {
        debug_assert!(from >= self.start, "position {from} was dropped by the window");
        self.k[h].view((from - self.start) * self.head_dim, (to - self.start) * self.head_dim)
    }

    /// KV head `h`'s values of positions `from..to` (at or after [`LayerKv::start`]).
    pub fn values(&self, h: usize, from: usize, to: usize) -> CachedRows<'_> {
        debug_assert!(from >= self.start, "position {from} was dropped by the window");
        self.v[h].view(
            (from - self.start) * self.v_head_dim,
            (to - self.start) * self.v_head_dim,
        )
    }

    /// Forgets every position from `len` on; everything when the window
    /// already dropped positions that `len` needs ([`LayerKv::can_cut_to`]).
    fn truncate(&mut self, len: usize) {
        if !self.can_cut_to(len) {
            for r in self.k.iter_mut().chain(&mut self.v) {
                r.truncate(0);
            }
            self.len = 0;
            self.start = 0;
            return;
        }
        for (k, v) in self.k.iter_mut().zip(&mut self.v) {
            k.truncate((len - self.start) * self.head_dim);
            v.truncate((len - self.start) * self.v_head_dim);
        }
        self.len = self.len.min(len);
    }

    /// Bytes held.
    fn bytes(&self) -> usize {
        self.k
            .iter()
            .chain(&self.v)
            .map(|x| x.elements() * self.dtype.size())
            .sum()
    }
}

/// The cache of a latent attention layer ([`crate::mla`]): per position,
/// one row of the normed latent and the roped key shared by every head
/// (`kv_lora_rank + qk_rope_head_dim` values), in the cache's dtype. The
/// latent part serves as keys and as values. A layer with a sparse-attention
/// indexer ([`crate::dsa_indexer`]) also keeps its keys here, and the
/// selection of the last step (which later layers may share).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LatentKv {
    rows: Rows,
    width: usize,
    len: usize,
    dtype: KvDtype,
    /// The indexer's keys, `index_head_dim` values per position (empty
    /// without an indexer).
    index: Rows,
    index_width: usize,
    /// The keys each row of the last step attended to.
    selection: crate::dsa_indexer::Selection,
}

impl LatentKv {
    fn new(width: usize, dtype: KvDtype) -> Self {
        LatentKv {
            rows: Rows::new(dtype),
            width,
            len: 0,
            dtype,
            index: Rows::new(dtype),
            index_width: 0,
            selection: Vec::new(),
        }
    }

    /// Cached positions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends one position's row (`width` values), rounded to the cache's dtype.
    pub fn push(&mut self, row: &[f32]) {
        debug_assert_eq!(row.len(), self.width);
        self.rows.extend(row);
        self.len += 1;
    }

    /// The rows of positions `from..to`.
    pub fn rows(&self, from: usize, to: usize) -> CachedRows<'_> {
        self.rows.view(from * self.width, to * self.width)
    }

    /// Appends one position's indexer key (every position's has the same
    /// width), rounded to the cache's dtype.
    pub fn push_index(&mut self, key: &[f32]) {
        debug_assert!(self.index_width == 0 || self.index_width == key.len());
        self.index_width = key.len();
        self.index.extend(key);
    }

    /// The indexer keys of positions `from..to`.
    pub fn index_rows(&self, from: usize, to: usize) -> CachedRows<'_> {
        self.index.view(from * self.index_width, to * self.index_width)
    }

    /// The keys each row of the last step attended to.
    pub fn selection(&self) -> &crate::dsa_indexer::Selection {
        &self.selection
    }

    /// Records the last step's selection.
    pub fn set_selection(&mut self, selection: crate::dsa_indexer::Selection) {
        self.selection = selection;
    }

    fn truncate(&mut self, len: usize) {
        self.rows.truncate(len * self.width);
        self.index.truncate(len * self.index_width);
        self.len = self.len.min(len);
        self.selection.clear();
    }

    fn bytes(&self) -> usize {
        (self.rows.elements() + self.index.elements()) * self.dtype.size()
    }
}

/// One layer's cache, of its mixer's kind.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum LayerCache {
    /// Attention: keys and values of every position.
    Kv(LayerKv),
    /// Latent attention: the compressed latent and rope key of every position.
    Latent(LatentKv),
    /// Gated DeltaNet: conv inputs and recurrent state after the last position.
    Recurrent(RecurrentState),
}

impl LayerCache {
    /// An empty key/value cache of `kv_heads` heads of `head_dim` in `dtype`.
    pub fn kv(kv_heads: usize, head_dim: usize, dtype: KvDtype) -> Self {
        LayerCache::Kv(LayerKv::new(kv_heads, head_dim, head_dim, dtype, None))
    }

    /// An empty key/value cache of `kv_heads` heads with keys of
    /// `head_dim` and values of `v_head_dim`; with a window, a
    /// sliding-window layer's, which keeps only what that window can still
    /// see ([`LayerKv::begin_step`]).
    pub fn attention(
        kv_heads: usize,
        head_dim: usize,
        v_head_dim: usize,
        dtype: KvDtype,
        window: Option<usize>,
    ) -> Self {
        LayerCache::Kv(LayerKv::new(kv_heads, head_dim, v_head_dim, dtype, window))
    }

    /// An empty latent cache of `width` values per position in `dtype`.
    pub fn latent(width: usize, dtype: KvDtype) -> Self {
        LayerCache::Latent(LatentKv::new(width, dtype))
    }

    /// Positions seen.
    pub fn len(&self) -> usize {
        match self {
            LayerCache::Kv(kv) => kv.len(),
            LayerCache::Latent(l) => l.len(),
            LayerCache::Recurrent(s) => s.len(),
        }
    }

    /// Whether no position was seen.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            LayerCache::Kv(kv) => kv.bytes(),
            LayerCache::Latent(l) => l.bytes(),
            LayerCache::Recurrent(s) => s.bytes(),
        }
    }
}

/// The whole cache of one sequence.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KvCache {
    pub layers: Vec<LayerCache>,
}

impl KvCache {
    /// An empty cache for `num_layers` attention layers of `kv_heads` heads
    /// of `head_dim`, stored as `dtype`.
    pub fn new(num_layers: usize, kv_heads: usize, head_dim: usize, dtype: KvDtype) -> Self {
        KvCache {
            layers: (0..num_layers)
                .map(|_| LayerCache::kv(kv_heads, head_dim, dtype))
                .collect(),
        }
    }

    /// A cache of the given per-layer caches.
    pub fn of(layers: Vec<LayerCache>) -> Self {
        KvCache { layers }
    }

    /// Positions cached (the next token's position).
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::len)
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every position from `len` on (reuse of a shared prefix) and
    /// returns how many positions are kept: `len` (or what was cached, if
    /// less), except that a recurrent layer cannot go back, nor a sliding
    /// layer past what it still holds, so with one whose state is past
    /// `len` (or that dropped what `len` needs) the whole cache starts over
    /// and 0 is kept.
    pub fn truncate(&mut self, len: usize) -> usize {
        let stuck = self.layers.iter().any(|l| match l {
            LayerCache::Recurrent(s) => s.len() > len,
            LayerCache::Kv(kv) => !kv.can_cut_to(len),
            LayerCache::Latent(_) => false,
        });
        let keep = if stuck { 0 } else { len.min(self.len()) };
        for l in &mut self.layers {
            match l {
                LayerCache::Kv(kv) => kv.truncate(keep),
                LayerCache::Latent(l) => l.truncate(keep),
                LayerCache::Recurrent(s) if s.len() > keep => s.reset(),
                LayerCache::Recurrent(_) => {}
            }
        }
        keep
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(LayerCache::bytes).sum()
    }

    /// Bytes each further position adds (a recurrent layer adds none; an
    /// indexer's keys count once the layer has seen a position; a sliding
    /// layer counts as [`KvCache::sliding_bytes`], not here).
    pub fn bytes_per_position(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerCache::Kv(kv) if kv.window.is_some() => 0,
                LayerCache::Kv(kv) => (kv.kv_dim() + kv.v_dim()) * kv.dtype.size(),
                LayerCache::Latent(l) => (l.width + l.index_width) * l.dtype.size(),
                LayerCache::Recurrent(_) => 0,
            })
            .sum()
    }

    /// The most bytes the sliding-window layers hold between steps of one
    /// row, however long the sequence: `2w - 2` positions each (see
    /// [`LayerKv`]), plus the row the step appends.
    pub fn sliding_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerCache::Kv(kv) => kv.window.map_or(0, |w| {
                    (2 * w).saturating_sub(1) * (kv.kv_dim() + kv.v_dim()) * kv.dtype.size()
                }),
                _ => 0,
            })
            .sum()
    }

    /// Whether [`KvCache::truncate`] can keep any shorter prefix (no
    /// recurrent layer, whose state cannot go back, and no sliding layer
    /// that dropped positions).
    pub fn rewinds(&self) -> bool {
        !self.layers.iter().any(|l| match l {
            LayerCache::Recurrent(_) => true,
            LayerCache::Kv(kv) => kv.start > 0,
            LayerCache::Latent(_) => false,
        })
    }

    /// Whether this cache (read back from a file, say) has the layout of
    /// `fresh` (an empty cache of the model: the same layer kinds, widths
    /// and dtype) and holds `len()` whole positions in every layer, so
    /// attention can read it without going out of bounds.
    pub fn fits(&self, fresh: &KvCache) -> bool {
        let len = self.len();
        self.layers.len() == fresh.layers.len()
            && self.layers.iter().zip(&fresh.layers).all(|(a, b)| match (a, b) {
                (LayerCache::Kv(a), LayerCache::Kv(b)) => {
                    a.dtype == b.dtype
                        && a.head_dim == b.head_dim
                        && a.v_head_dim == b.v_head_dim
                        && a.k.len() == b.k.len()
                        && a.v.len() == b.v.len()
                        && a.window == b.window
                        && a.len == len
                        && a.start <= len
                        && (a.start == 0 || a.window.is_some_and(|w| a.start <= (len + 1).saturating_sub(w)))
                        && a.k.iter().all(|r| rows_of(r, a.dtype, (len - a.start) * a.head_dim))
                        && a.v.iter().all(|r| rows_of(r, a.dtype, (len - a.start) * a.v_head_dim))
                }
                (LayerCache::Latent(a), LayerCache::Latent(b)) => {
                    a.dtype == b.dtype
                        && a.width == b.width
                        && a.len == len
                        && rows_of(&a.rows, a.dtype, len * a.width)
                        && (b.index_width == 0 || a.index_width == 0 || a.index_width == b.index_width)
                        && (a.index_width == 0 || len == 0 || rows_of(&a.index, a.dtype, len * a.index_width))
                        && (a.index_width != 0 || a.index.elements() == 0)
                }
                (LayerCache::Recurrent(a), LayerCache::Recurrent(b)) => a.same_shape(b) && a.len() == len,
                _ => false,
            })
    }
}

/// Whether `rows` holds `elements` values of `dtype`.
fn rows_of(rows: &Rows, dtype: KvDtype, elements: usize) -> bool {
    matches!(
        (rows, dtype),
        (Rows::F32(_), KvDtype::F32) | (Rows::F16(_), KvDtype::F16)
    ) && rows.elements() == elements
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(c: &KvCache, l: usize) -> &LayerKv {
        match &c.layers[l] {
            LayerCache::Kv(kv) => kv,
            _ => panic!("layer {l} is not an attention layer"),
        }
    }

    fn filled(dtype: KvDtype) -> KvCache {
        let mut c = KvCache::new(2, 2, 4, dtype);
        for pos in 0..3 {
            let k: Vec<f32> = (0..8).map(|i| pos as f32 + i as f32 / 3.0).collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            for l in &mut c.layers {
                let LayerCache::Kv(l) = l else {
                    unreachable!("attention layers")
                };
                l.push(&k, &v);
            }
        }
        c
    }

    #[test]
    fn f16_cache_rounds_to_nearest_and_holds_half_the_bytes() {
        let (exact, half) = (filled(KvDtype::F32), filled(KvDtype::F16));
        assert_eq!((exact.len(), half.len()), (3, 3));
        assert_eq!(exact.bytes(), 2 * 2 * 2 * 3 * 4 * 4);
        assert_eq!(2 * half.bytes(), exact.bytes());
        // Head 1's keys of positions 1..3 against q = 1: each row's sum.
        let (mut a, mut b) = ([0.0; 2], [0.0; 2]);
        kv(&exact, 0).keys(1, 1, 3).dots(&[1.0; 4], &mut a);
        kv(&half, 0).keys(1, 1, 3).dots(&[1.0; 4], &mut b);
        let rounded = |x: f32| half::f16::from_f32(x).to_f32();
        for (pos, (&a, &b)) in a.iter().zip(&b).enumerate() {
            let row: Vec<f32> = (4..8).map(|i| (pos + 1) as f32 + i as f32 / 3.0).collect();
            assert_eq!(a, row.iter().sum::<f32>());
            assert_eq!(b, row.iter().map(|&x| rounded(x)).sum::<f32>());
            assert_ne!(a, b, "1/3 steps are not f16 numbers");
        }
        let mut out = [0.0; 4];
        kv(&half, 1).values(0, 0, 1).add_weighted(&[2.0], &mut out);
        assert_eq!(out, [0.0, rounded(-2.0 / 3.0), rounded(-4.0 / 3.0), -2.0]);
    }

    #[test]
    fn truncate_forgets_positions_in_either_dtype() {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let mut c = filled(dtype);
            let full = c.bytes();
            c.truncate(1);
            assert_eq!(c.len(), 1);
            assert_eq!(3 * c.bytes(), full);
            assert_eq!(kv(&c, 0).dtype(), dtype);
        }
    }

    #[test]
    fn a_recurrent_layer_past_the_cut_restarts_the_whole_cache() {
        let mut c = filled(KvDtype::F32);
        let mut state = RecurrentState::new(4, 3, 1, 2, 2);
        for _ in 0..3 {
            state.advance();
        }
        c.layers.push(LayerCache::Recurrent(state));
        // Extending what is cached keeps everything.
        assert_eq!(c.truncate(3), 3);
        assert_eq!(c.len(), 3);
        // Cutting back cannot rewind the recurrent state: start over.
        assert_eq!(c.truncate(1), 0);
        assert!(c.layers.iter().all(LayerCache::is_empty));
    }

    /// Pushes positions `from..to` (row `p` filled with `p`) as one step.
    fn step(l: &mut LayerKv, from: usize, to: usize) {
        l.begin_step();
        for p in from..to {
            let row = vec![p as f32; l.kv_dim()];
            l.push(&row, &row);
        }
    }

    #[test]
    fn a_sliding_layer_holds_only_what_its_window_can_still_see() {
        let w = 4;
        let (mut bounded, mut unbounded) = (
            LayerKv::new(1, 2, 2, KvDtype::F32, Some(w)),
            LayerKv::new(1, 2, 2, KvDtype::F32, None),
        );
        step(&mut bounded, 0, 6);
        step(&mut unbounded, 0, 6);
        for pos in 6..100 {
            step(&mut bounded, pos, pos + 1);
            step(&mut unbounded, pos, pos + 1);
            assert!((w..2 * w).contains(&bounded.held()), "{pos}: {}", bounded.held());
            assert_eq!(bounded.bytes(), bounded.held() * 2 * 2 * 4);
            // The window of the last row reads the same rows from both.
            let (mut a, mut b) = ([0.0; 4], [0.0; 4]);
            bounded.keys(0, pos + 1 - w, pos + 1).dots(&[1.0, 1.0], &mut a);
            unbounded.keys(0, pos + 1 - w, pos + 1).dots(&[1.0, 1.0], &mut b);
            assert_eq!(a, b);
            assert_eq!(a[3], 2.0 * pos as f32);
        }
        assert_eq!(unbounded.held(), 100);
        // A step of many rows keeps what its first row needs.
        step(&mut bounded, 100, 110);
        assert!(bounded.start() <= 100 + 1 - w);
        // Cutting back within what is held works; further back starts over.
        let mut c = KvCache::of(vec![LayerCache::Kv(bounded)]);
        assert!(!c.rewinds());
        assert_eq!(c.truncate(108), 108);
        assert_eq!(c.truncate(20), 0);
        assert!(c.is_empty() && c.rewinds());
    }

    #[test]
    fn dtype_names_parse_and_print() {
        assert_eq!("F16".parse::<KvDtype>(), Ok(KvDtype::F16));
        assert_eq!(KvDtype::F32.to_string(), "f32");
        assert!("q8".parse::<KvDtype>().unwrap_err().contains("f32 or f16"));
    }
}
