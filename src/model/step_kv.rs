//! Where a step keeps keys and values: the [`StepKv`] stores add the calls that write a layer's
//! new rows into its cache and attend over it to a [`Step`] — the contiguous cache
//! (`CatDirect`/`KvAppend` + `Attention`), the graph-mode decode cache (`DecodeAttention`) and
//! the paged pool (`PagedCacheWrite` + `PagedAttention`); the padded batched decode store lives
//! in `paged_graph`. Latent attention, which runs as a stage, gets a direct [`KvStore`] of one
//! layer from its store.

use crate::data::{Data, DataType};
use crate::error::{Error, Result};
use crate::executor::Executor;
use crate::ops::{self, AttentionParams, RotaryParams, RotaryStyle};
use crate::step::{Call, Step, TensorId};

/// A KV store run op by op: stores this step's k/v rows of `layer` and computes attention of
/// `q` over everything cached, calling the ops at once. Latent attention (a stage of a step,
/// [`super::mla::mla_attention`]) reads its layer's cache through it; a step's other layers
/// describe their attention through this module's `StepKv` stores.
pub trait KvStore {
    /// Appends `k`, `v` [rows, nkv, hd] for `layer` and writes attention of `q` into `out`.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &mut self,
        e: &Executor,
        layer: usize,
        q: &Data,
        k: &Data,
        v: &Data,
        p: &AttentionParams,
        out: &mut Data,
    ) -> Result<()>;

    /// [`KvStore::attend`] where the step's rows `kv` [rows, nkv, hd] serve as both keys and
    /// values (latent attention): a store may keep them once.
    fn attend_shared(
        &mut self,
        e: &Executor,
        layer: usize,
        q: &Data,
        kv: &Data,
        p: &AttentionParams,
        out: &mut Data,
    ) -> Result<()> {
        self.attend(e, layer, q, kv, kv, p, out)
    }
}

/// A step's rotation, over step tensors.
#[derive(Clone, Copy, Debug)]
pub(super) struct StepRotary {
    /// Positions, I32 [rows].
    pub positions: TensorId,
    /// Fixed inverse frequencies, when the op's own are not exact.
    pub inv_freq: Option<TensorId>,
    /// Rotated dims per head.
    pub rotary_dim: usize,
    /// Pairing.
    pub style: RotaryStyle,
    /// Base.
    pub theta: f32,
    /// The step's `cos`/`sin` tables, when formed.
    pub tables: Option<(TensorId, TensorId)>,
}

impl StepRotary {
    /// `c` with the angle inputs (the tables, else the positions and inverse frequencies) and
    /// the rotation's parameters.
    pub fn args(&self, c: Call) -> Call {
        let c = match self.tables {
            Some((cos, sin)) => c.input("cos", cos).input("sin", sin),
            None => c
                .input("positions", self.positions)
                .input_opt("inv_freq", self.inv_freq),
        };
        self.ints(c.float("theta", self.theta))
    }

    /// `c` with `rotary_dim` and `style`.
    pub fn ints(&self, c: Call) -> Call {
        c.int("rotary_dim", self.rotary_dim as i32)
            .int("style", self.style as i32)
    }
}

/// A layer's attention parameters, over step tensors.
#[derive(Clone, Copy, Debug)]
pub(super) struct StepAttention {
    /// Score scale.
    pub scale: f32,
    /// Soft-capping (0 = off).
    pub softcap: f32,
    /// Sliding window (0 = off).
    pub sliding_window: usize,
    /// ALiBi slopes.
    pub alibi: Option<TensorId>,
    /// Attention sinks.
    pub sinks: Option<TensorId>,
    /// The `fast` precision.
    pub fast: bool,
    /// Query rows of the step.
    pub rows: usize,
}

impl StepAttention {
    /// `c` with the slopes and sinks (when given), `output` and the scale and soft-cap.
    pub fn args(&self, c: Call, out: TensorId) -> Call {
        c.input_opt("alibi_slopes", self.alibi)
            .input_opt("sinks", self.sinks)
            .output("output", out)
            .float("scale", self.scale)
            .float("softcap", self.softcap)
            .int("sliding_window", self.sliding_window as i32)
            .rows(self.rows)
    }
}

/// A step's q, k, v of one layer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Qkv {
    pub q: TensorId,
    pub k: TensorId,
    pub v: TensorId,
}

/// Where a step keeps keys and values (see the module doc).
pub(super) trait StepKv<'a> {
    /// Adds the calls that store `x.k`, `x.v` [rows, nkv, hd] for `layer` and write attention
    /// of `x.q` into `out`.
    fn attend(
        &mut self,
        st: &mut Step<'a>,
        layer: usize,
        x: Qkv,
        p: &StepAttention,
        out: TensorId,
    ) -> Result<()>;

    /// A direct store of layer `layer` alone, for latent attention (a stage); only the
    /// op-by-op stores (a contiguous cache, the paged pool) have one.
    fn latent_layer(&mut self, _layer: usize) -> Result<Box<dyn KvStore + 'a>> {
        Err(Error::invalid(
            "latent attention runs only in op-by-op steps, not in recorded or padded decode steps",
        ))
    }
}

/// The layer caches of a store, each handed to the step once.
pub(super) struct Layers<'a> {
    k: Vec<Option<&'a mut Data>>,
    v: Vec<Option<&'a mut Data>>,
    ids: Vec<Option<(TensorId, TensorId)>>,
}

impl<'a> Layers<'a> {
    /// Over the caches `k`, `v` (one per layer; `v` empty for latent attention).
    pub fn new(k: &'a mut [Data], v: &'a mut [Data]) -> Layers<'a> {
        let n = k.len();
        Layers {
            k: k.iter_mut().map(Some).collect(),
            v: v.iter_mut().map(Some).collect(),
            ids: vec![None; n],
        }
    }

    /// The step tensors of layer `layer`'s key and value caches.
    pub fn get(&mut self, st: &mut Step<'a>, layer: usize) -> Result<(TensorId, TensorId)> {
        if let Some(Some(ids)) = self.ids.get(layer) {
            return Ok(*ids);
        }
        let missing = || Error::invalid(format!("KV cache has no layer {layer}"));
        let kc = self
            .k
            .get_mut(layer)
            .and_then(Option::take)
            .ok_or_else(missing)?;
        let vc = self
            .v
            .get_mut(layer)
            .and_then(Option::take)
            .ok_or_else(missing)?;
        let ids = (st.mutable(kc), st.mutable(vc));
        if let Some(e) = self.ids.get_mut(layer) {
            *e = Some(ids);
        }
        Ok(ids)
    }

    /// The key cache of layer `layer` itself (latent attention; never handed to the step).
    pub fn take_k(&mut self, layer: usize) -> Result<&'a mut Data> {
        self.k.get_mut(layer).and_then(Option::take).ok_or_else(|| {
            Error::invalid(format!("KV cache has no layer {layer} (or it was taken)"))
        })
    }

    /// Layer `layer`'s value cache itself, when the store has one (a paged pool keeps latent
    /// rows as keys and as values).
    pub fn take_v(&mut self, layer: usize) -> Option<&'a mut Data> {
        self.v.get_mut(layer).and_then(Option::take)
    }

    /// The dtype of layer `layer`'s key cache.
    pub fn dtype(&self, layer: usize) -> Option<DataType> {
        self.k.get(layer)?.as_ref().map(|d| d.dtype())
    }
}

/// Device arrays a decode store's attention reads (positions, slots, block tables...) and the
/// workspace it writes, each added to the step at its first attention.
pub(super) struct StepArrays<'a, const N: usize> {
    inputs: [&'a Data; N],
    workspace: Option<&'a mut Data>,
    ids: Option<([TensorId; N], TensorId)>,
}

impl<'a, const N: usize> StepArrays<'a, N> {
    /// Over `inputs` and `workspace`.
    pub fn new(inputs: [&'a Data; N], workspace: &'a mut Data) -> Self {
        StepArrays {
            inputs,
            workspace: Some(workspace),
            ids: None,
        }
    }

    /// The step tensors of the inputs and of the workspace.
    pub fn get(&mut self, st: &mut Step<'a>) -> Result<([TensorId; N], TensorId)> {
        if let Some(ids) = self.ids {
            return Ok(ids);
        }
        let w = self
            .workspace
            .take()
            .ok_or_else(|| Error::invalid("decode step: no workspace"))?;
        let ids = (self.inputs.map(|d| st.input(d)), st.mutable(w));
        Ok(*self.ids.insert(ids))
    }
}

/// The contiguous cache of one sequence.
pub(super) struct CacheKv<'a> {
    pub layers: Layers<'a>,
}

impl<'a> StepKv<'a> for CacheKv<'a> {
    fn attend(
        &mut self,
        st: &mut Step<'a>,
        layer: usize,
        x: Qkv,
        p: &StepAttention,
        out: TensorId,
    ) -> Result<()> {
        let f32_cache = self.layers.dtype(layer) == Some(DataType::F32);
        let (kc, vc) = self.layers.get(st, layer)?;
        for (cache, src) in [(kc, x.k), (vc, x.v)] {
            st.push(if f32_cache {
                Call::new("CatDirect")
                    .output("input0", cache)
                    .input("input1", src)
                    .int("axis", 0)
            } else {
                Call::new("KvAppend")
                    .output("cache", cache)
                    .input("input", src)
            });
        }
        let c = Call::new("Attention")
            .input("q", x.q)
            .input("k", kc)
            .input("v", vc)
            .int("causal", 1)
            .int("fast", p.fast as i32);
        st.push(p.args(c, out));
        Ok(())
    }

    fn latent_layer(&mut self, layer: usize) -> Result<Box<dyn KvStore + 'a>> {
        Ok(Box::new(LatentCache {
            k: self.layers.take_k(layer)?,
        }))
    }
}

/// One layer of a contiguous cache holding latent rows (key and value at once).
struct LatentCache<'a> {
    k: &'a mut Data,
}

impl KvStore for LatentCache<'_> {
    fn attend(
        &mut self,
        _: &Executor,
        _: usize,
        _: &Data,
        _: &Data,
        _: &Data,
        _: &AttentionParams,
        _: &mut Data,
    ) -> Result<()> {
        Err(Error::invalid("a latent cache keeps one row per token"))
    }

    fn attend_shared(
        &mut self,
        e: &Executor,
        _layer: usize,
        q: &Data,
        kv: &Data,
        p: &AttentionParams,
        out: &mut Data,
    ) -> Result<()> {
        if self.k.dtype() == DataType::F32 {
            ops::cat_direct(e, self.k, kv, 0)?;
        } else {
            ops::kv_append(e, self.k, kv)?;
        }
        ops::attention(e, q, self.k, self.k, p, out)
    }
}

/// The store of a graph-mode decode step: `DecodeAttention` stores the step's keys and values
/// in row `pos` of the caches and attends over rows 0..=pos (a device may move the step's
/// rotation into it), with the position read on the device, so the recorded work does not
/// depend on the host-side length.
pub(super) struct GraphKv<'a> {
    layers: Layers<'a>,
    /// The position and the workspace.
    arrays: StepArrays<'a, 1>,
}

impl<'a> GraphKv<'a> {
    /// Over the caches `layers`, the step's position `pos` (on the device) and the attention's
    /// `workspace`.
    pub fn new(layers: Layers<'a>, pos: &'a Data, workspace: &'a mut Data) -> GraphKv<'a> {
        GraphKv {
            layers,
            arrays: StepArrays::new([pos], workspace),
        }
    }
}

impl<'a> StepKv<'a> for GraphKv<'a> {
    fn attend(
        &mut self,
        st: &mut Step<'a>,
        layer: usize,
        x: Qkv,
        p: &StepAttention,
        out: TensorId,
    ) -> Result<()> {
        let ([pos], workspace) = self.arrays.get(st)?;
        let (kc, vc) = self.layers.get(st, layer)?;
        let c = Call::new("DecodeAttention")
            .input("q", x.q)
            .input("positions", pos)
            .output("k_cache", kc)
            .output("v_cache", vc)
            .input("k", x.k)
            .input("v", x.v)
            .output("workspace", workspace);
        st.push(p.args(c, out));
        Ok(())
    }
}

/// The index arrays of a paged step (host tensors; the ops copy them where they run).
pub(super) struct PagedIndex {
    pub slots: Data,
    pub q_starts: Data,
    pub kv_lens: Data,
    pub tables: Data,
    pub block_size: usize,
}

/// The store of a paged step: `PagedCacheWrite` + `PagedAttention` over the pool's layers.
pub(super) struct PagedKv<'a> {
    pub layers: Layers<'a>,
    pub index: &'a PagedIndex,
    /// The index arrays' step tensors, once added.
    ids: Option<[TensorId; 4]>,
}

impl<'a> PagedKv<'a> {
    /// Over the pool layers `k`, `v` and the step's `index`.
    pub fn new(k: &'a mut [Data], v: &'a mut [Data], index: &'a PagedIndex) -> PagedKv<'a> {
        PagedKv {
            layers: Layers::new(k, v),
            index,
            ids: None,
        }
    }

    fn ids(&mut self, st: &mut Step<'a>) -> [TensorId; 4] {
        let i = self.index;
        *self.ids.get_or_insert_with(|| {
            [
                st.input(&i.slots),
                st.input(&i.q_starts),
                st.input(&i.kv_lens),
                st.input(&i.tables),
            ]
        })
    }
}

impl<'a> StepKv<'a> for PagedKv<'a> {
    fn attend(
        &mut self,
        st: &mut Step<'a>,
        layer: usize,
        x: Qkv,
        p: &StepAttention,
        out: TensorId,
    ) -> Result<()> {
        let [slots, q_starts, kv_lens, tables] = self.ids(st);
        let (kc, vc) = self.layers.get(st, layer)?;
        for (src, cache) in [(x.k, kc), (x.v, vc)] {
            st.push(
                Call::new("PagedCacheWrite")
                    .input("input", src)
                    .input("slots", slots)
                    .output("cache", cache),
            );
        }
        let c = Call::new("PagedAttention")
            .input("q", x.q)
            .input("k_cache", kc)
            .input("v_cache", vc)
            .input("q_starts", q_starts)
            .input("kv_lens", kv_lens)
            .input("block_tables", tables)
            .int("block_size", self.index.block_size as i32);
        st.push(p.args(c, out));
        Ok(())
    }

    fn latent_layer(&mut self, layer: usize) -> Result<Box<dyn KvStore + 'a>> {
        let k = self.layers.take_k(layer)?;
        let v = self
            .layers
            .take_v(layer)
            .ok_or_else(|| Error::invalid(format!("paged pool has no layer {layer}")))?;
        Ok(Box::new(LatentPaged {
            k,
            v,
            index: self.index,
        }))
    }
}

/// One layer of a paged pool holding latent rows.
struct LatentPaged<'a> {
    k: &'a mut Data,
    v: &'a mut Data,
    index: &'a PagedIndex,
}

impl KvStore for LatentPaged<'_> {
    fn attend(
        &mut self,
        e: &Executor,
        _: usize,
        q: &Data,
        k: &Data,
        _: &Data,
        p: &AttentionParams,
        out: &mut Data,
    ) -> Result<()> {
        self.attend_shared(e, 0, q, k, p, out)
    }

    fn attend_shared(
        &mut self,
        e: &Executor,
        _layer: usize,
        q: &Data,
        kv: &Data,
        p: &AttentionParams,
        out: &mut Data,
    ) -> Result<()> {
        use crate::device::{DataDict, FloatDict, IntDict};
        let i = self.index;
        for cache in [&mut *self.k, &mut *self.v] {
            let mut d = DataDict::new()
                .with("input", kv)
                .with("slots", &i.slots)
                .with_mut("cache", cache);
            e.run(
                "PagedCacheWrite",
                &mut d,
                &FloatDict::new(),
                &IntDict::new(),
            )?;
        }
        let mut d = DataDict::new()
            .with("q", q)
            .with("k_cache", self.k)
            .with("v_cache", self.v)
            .with("q_starts", &i.q_starts)
            .with("kv_lens", &i.kv_lens)
            .with("block_tables", &i.tables);
        let floats = p.args(&mut d, out);
        e.run(
            "PagedAttention",
            &mut d,
            &floats,
            &IntDict::new()
                .with("block_size", i.block_size as i32)
                .with("sliding_window", p.sliding_window as i32),
        )
    }
}

/// A rotation over host-side tensors, for latent attention's stage.
pub(super) fn rotary_params<'d>(
    r: &StepRotary,
    positions: &'d Data,
    inv_freq: Option<&'d Data>,
    tables: Option<(&'d Data, &'d Data)>,
) -> RotaryParams<'d> {
    RotaryParams {
        positions,
        inv_freq,
        rotary_dim: r.rotary_dim,
        style: r.style,
        theta: r.theta,
        tables,
    }
}
