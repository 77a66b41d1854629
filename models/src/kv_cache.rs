//! Per-layer key/value cache of one sequence.
//!
//! Keys are stored after RoPE. Each layer owns its own cache, so layers of
//! different kinds (full, sliding, later MLA or recurrent state) can keep
//! different shapes.

/// Keys and values of one attention layer, `len × kv_dim` each.
#[derive(Clone, Debug, Default)]
pub struct LayerKv {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    kv_dim: usize,
}

impl LayerKv {
    fn new(kv_dim: usize) -> Self {
        LayerKv {
            k: Vec::new(),
            v: Vec::new(),
            kv_dim,
        }
    }

    /// Cached positions.
    pub fn len(&self) -> usize {
        self.k.len() / self.kv_dim.max(1)
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.k.is_empty()
    }

    /// Width of one cached key (`kv_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }
}

/// The whole cache of one sequence.
#[derive(Clone, Debug)]
pub struct KvCache {
    pub layers: Vec<LayerKv>,
}

impl KvCache {
    /// An empty cache for `num_layers` layers of width `kv_dim`.
    pub fn new(num_layers: usize, kv_dim: usize) -> Self {
        KvCache {
            layers: (0..num_layers).map(|_| LayerKv::new(kv_dim)).collect(),
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
            let n = len * l.kv_dim;
            l.k.truncate(n);
            l.v.truncate(n);
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| (l.k.len() + l.v.len()) * 4).sum()
    }
}
