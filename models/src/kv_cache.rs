//! Per-layer key/value cache of one sequence.
//!
//! Keys are stored after RoPE. Each layer owns its own cache, so layers of
//! different kinds (full, sliding, later MLA or recurrent state) can keep
//! different shapes.

/// Keys and values of one attention layer, stored head-major: per KV head,
/// `len × head_dim` keys (and values) in one contiguous run, so a head's
/// attention reads its cache front to back instead of striding across
/// every head's row (a page per position at long contexts).
#[derive(Clone, Debug, Default)]
pub struct LayerKv {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    head_dim: usize,
    len: usize,
}

impl LayerKv {
    fn new(kv_heads: usize, head_dim: usize) -> Self {
        LayerKv {
            k: vec![Vec::new(); kv_heads],
            v: vec![Vec::new(); kv_heads],
            head_dim,
            len: 0,
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

    /// Appends one position's key and value rows (`kv_dim` each, head after
    /// head, as the projections produce them).
    pub fn push(&mut self, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        debug_assert_eq!((k.len(), v.len()), (self.kv_dim(), self.kv_dim()));
        for (h, (kh, vh)) in k.chunks_exact(hd).zip(v.chunks_exact(hd)).enumerate() {
            self.k[h].extend_from_slice(kh);
            self.v[h].extend_from_slice(vh);
        }
        self.len += 1;
    }

    /// KV head `h`'s keys, `len × head_dim`.
    pub fn keys(&self, h: usize) -> &[f32] {
        &self.k[h]
    }

    /// KV head `h`'s values, `len × head_dim`.
    pub fn values(&self, h: usize) -> &[f32] {
        &self.v[h]
    }

    /// Forgets every position from `len` on.
    fn truncate(&mut self, len: usize) {
        let n = len * self.head_dim;
        for (k, v) in self.k.iter_mut().zip(&mut self.v) {
            k.truncate(n);
            v.truncate(n);
        }
        self.len = self.len.min(len);
    }

    /// Bytes held.
    fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(|x| x.len() * 4).sum()
    }
}

/// The whole cache of one sequence.
#[derive(Clone, Debug)]
pub struct KvCache {
    pub layers: Vec<LayerKv>,
}

impl KvCache {
    /// An empty cache for `num_layers` layers of `kv_heads` heads of
    /// `head_dim`.
    pub fn new(num_layers: usize, kv_heads: usize, head_dim: usize) -> Self {
        KvCache {
            layers: (0..num_layers).map(|_| LayerKv::new(kv_heads, head_dim)).collect(),
        }
    }

    /// Positions cached (the next token's position).
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerKv::len)
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every position from `len` on (reuse of a shared prefix).
    pub fn truncate(&mut self, len: usize) {
        for l in &mut self.layers {
            l.truncate(len);
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(LayerKv::bytes).sum()
    }
}
