//! Activation rows laid out for the AMX product, once per product: in
//! tiles of 16 rows, each 32-element block as one AMX `B` tile (8 rows of
//! 64 bytes: row `j` holds bytes `4j..4j + 4` of the block of each of the
//! 16 activation rows, `tdpbssd`'s pairing of four bytes), and per tile
//! and block the 16 rows' scales and code sums the terms need.

use super::super::super::types::QK;
use super::super::Q8Acts;
use super::{line_bytes_mut, zeroed_lines, Line, ROWS};

/// Bytes of one block's `B` tile.
pub(super) const B_TILE: usize = 8 * 64;

/// Quantized activation rows as the AMX product reads them (rows past the
/// last, up to a whole tile, are zero).
#[derive(Clone, Debug, Default)]
pub struct AmxActs {
    /// Activation rows.
    pub(super) n: usize,
    /// Elements per row.
    pub(super) cols: usize,
    /// Per tile and block, its [`B_TILE`] bytes.
    pub(super) b: Vec<Line>,
    /// Per tile and block, 16 lanes (one per activation row): `d[b]`.
    pub(super) dx: Vec<f32>,
    /// ... `s16[2b] + s16[2b + 1]`.
    pub(super) s: Vec<i32>,
    /// ... `dx · f32(S)` (Q4_K's and Q5_K's min term).
    pub(super) xs: Vec<f32>,
    /// ... `s16[2b]` and `s16[2b + 1]` (Q2_K's mins).
    pub(super) s0: Vec<i32>,
    pub(super) s1: Vec<i32>,
}

impl AmxActs {
    /// No rows.
    pub const EMPTY: AmxActs = AmxActs {
        n: 0,
        cols: 0,
        b: Vec::new(),
        dx: Vec::new(),
        s: Vec::new(),
        xs: Vec::new(),
        s0: Vec::new(),
        s1: Vec::new(),
    };

    /// Lays out `acts` (rows of one width).
    ///
    /// # Panics
    /// If the rows differ in width.
    pub fn new(acts: &[&Q8Acts]) -> Self {
        let mut a = AmxActs::default();
        a.fill(acts);
        a
    }

    /// Rows.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Elements per row.
    pub fn width(&self) -> usize {
        self.cols
    }

    /// Tiles of 16 rows.
    pub(super) fn tiles(&self) -> usize {
        self.n.div_ceil(ROWS)
    }

    /// Lays out `acts` in place of the rows held, reusing the buffers.
    ///
    /// # Panics
    /// If the rows differ in width.
    pub fn fill(&mut self, acts: &[&Q8Acts]) {
        let cols = acts.first().map_or(0, |a| a.len());
        assert!(
            acts.iter().all(|a| a.len() == cols),
            "activation rows of different widths"
        );
        let nb = cols / QK;
        self.n = acts.len();
        self.cols = cols;
        let tiles = self.tiles();
        zeroed_lines(&mut self.b, tiles * nb * B_TILE);
        let bytes = line_bytes_mut(&mut self.b);
        let lanes = tiles * nb * ROWS;
        for v in [&mut self.dx, &mut self.xs] {
            v.clear();
            v.resize(lanes, 0.0);
        }
        for v in [&mut self.s, &mut self.s0, &mut self.s1] {
            v.clear();
            v.resize(lanes, 0);
        }
        for (i, a) in acts.iter().enumerate() {
            let (tile, t) = (i / ROWS, i % ROWS);
            for b in 0..nb {
                let at = (tile * nb + b) * ROWS + t;
                let (s0, s1) = (a.s16[2 * b], a.s16[2 * b + 1]);
                let dx = a.d[b];
                self.dx[at] = dx;
                self.s[at] = s0 + s1;
                self.xs[at] = dx * (s0 + s1) as f32;
                (self.s0[at], self.s1[at]) = (s0, s1);
                let tile_b = &mut bytes[(tile * nb + b) * B_TILE..(tile * nb + b + 1) * B_TILE];
                let q = &a.qs[b * QK..(b + 1) * QK];
                for j in 0..8 {
                    tile_b[64 * j + 4 * t..64 * j + 4 * t + 4].copy_from_slice(&q[4 * j..4 * j + 4]);
                }
            }
        }
    }
}
