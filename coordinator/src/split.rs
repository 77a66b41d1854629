//! `split`: a container cut into partial copies, one per machine, by the
//! placement plan — so a model is never copied whole to every machine.
//!
//! Each machine is described by the RAM it gives the expert cache (and,
//! optionally, its disk). The parts are planned as the cluster would plan
//! them ([`crate::cluster::placement::plan`], every machine taken as equally
//! fast): each expert gets an owner, and where a machine has cache to
//! spare, the hottest experts (by `--heat`, rows routed per expert; uniform
//! without it) get a replica there. A part holds what its machine owns plus
//! its replicas: the dense file and the model's other files (hard-linked
//! where the file system allows, else copied), an `experts.bin` of just
//! those records (bytes and checksums unchanged, offsets renumbered) and a
//! manifest that lists them, with the model's fingerprint — so a worker
//! serves it as a partial copy of that model, and a coordinator refuses it
//! for any other. Every part is written beside its final name and renamed
//! when whole.

use std::collections::BTreeSet;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use charm_common::container::{Manifest, Record, RECORD_ALIGN};
use charm_proto::{ExpertRange, Holdings, LayerHolding};

use crate::cluster::placement::{plan, Candidate, Holder, Key, ModelShape};

/// One machine to split for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Machine {
    /// RAM for the expert cache, in bytes.
    pub ram_bytes: u64,
    /// Disk for the part, in bytes (`None`: no limit).
    pub disk_bytes: Option<u64>,
}

/// What one part holds.
#[derive(Clone, Debug, PartialEq)]
pub struct PartSummary {
    pub path: PathBuf,
    pub owns: usize,
    pub replicas: usize,
    /// Bytes of its `experts.bin`.
    pub expert_bytes: u64,
}

/// `part-0`, `part-1`, … under `out`.
pub fn part_dir(out: &Path, i: usize) -> PathBuf {
    out.join(format!("part-{i}"))
}

/// The experts each machine gets (owned, then replicas), by the plan.
pub fn assign(manifest: &Manifest, machines: &[Machine], heat: &[Vec<u64>]) -> Result<Vec<(Vec<Key>, Vec<Key>)>> {
    if machines.is_empty() {
        bail!("split needs at least one machine");
    }
    let keys: BTreeSet<Key> = manifest.records.iter().map(|r| (r.layer, r.expert)).collect();
    let moe_layers: Vec<u16> = keys.iter().map(|k| k.0).collect::<BTreeSet<_>>().into_iter().collect();
    let num_experts = keys.iter().map(|k| k.1 + 1).max().unwrap_or(0);
    if keys.len() != moe_layers.len() * num_experts as usize {
        bail!("the container is itself a partial copy (not every layer has every expert); split the whole model");
    }
    let top_k = manifest.config["num_experts_per_tok"]
        .as_u64()
        .or_else(|| manifest.config["text_config"]["num_experts_per_tok"].as_u64())
        .unwrap_or(1) as usize;
    let shape = ModelShape {
        num_layers: moe_layers.last().map_or(0, |l| *l as usize + 1),
        moe_layers: moe_layers.clone(),
        num_experts,
        top_k,
        hidden: manifest.hidden_size as u32,
    };
    let record_bytes = manifest.records.iter().map(Record::padded_len).max().unwrap_or(0);
    let everything = Holdings {
        layers: moe_layers
            .iter()
            .map(|&layer| LayerHolding {
                layer,
                ranges: vec![ExpertRange {
                    start: 0,
                    end: num_experts,
                }],
            })
            .collect(),
    };
    let address = |i: usize| SocketAddr::from((Ipv4Addr::LOCALHOST, 1 + i as u16));
    let candidates: Vec<Candidate> = machines
        .iter()
        .enumerate()
        .map(|(i, m)| Candidate {
            address: address(i),
            holdings: everything.clone(),
            expert_bytes: record_bytes,
            cache_bytes: m.ram_bytes,
            disk_bytes_per_s: 1e9,
            expert_rows_per_s: 1e6,
        })
        .collect();
    let p = plan(&shape, &candidates, heat, false, None);
    let mut out = vec![(Vec::new(), Vec::new()); machines.len()];
    for &k in &keys {
        for (rank, h) in p.warm_holders(k).iter().enumerate() {
            if let Holder::Worker(a) = h {
                let i = a.port() as usize - 1;
                if rank == 0 {
                    out[i].0.push(k);
                } else {
                    out[i].1.push(k);
                }
            }
        }
        if p.warm_holders(k).is_empty() {
            // No cache anywhere: the owner alone holds it.
            if let Some(Holder::Worker(a)) = p.owner(k) {
                out[a.port() as usize - 1].0.push(k);
            }
        }
    }
    Ok(out)
}

/// Splits the container `src` into one part per machine under `out` (which
/// must not exist).
pub fn split(src: &Path, out: &Path, machines: &[Machine], heat: &[Vec<u64>]) -> Result<Vec<PartSummary>> {
    if !charm_common::container::is_container(src) {
        bail!(
            "{}: not a charm container (make one with `coordinator --model DIR convert`)",
            src.display()
        );
    }
    let manifest = Manifest::open(src).with_context(|| format!("opening {}", src.display()))?;
    if out.exists() {
        bail!("{}: already exists; remove it or choose another --out", out.display());
    }
    let parts = assign(&manifest, machines, heat)?;
    for (i, ((own, rep), m)) in parts.iter().zip(machines).enumerate() {
        let bytes = bytes_of(&manifest, own.iter().chain(rep));
        if let Some(disk) = m.disk_bytes {
            if bytes > disk {
                bail!(
                    "part {i} needs {bytes} bytes of experts but its machine has {disk} bytes of disk; give it more disk \
                     or add a machine"
                );
            }
        }
    }
    let partial = crate::convert::partial_dir(out);
    if partial.exists() {
        std::fs::remove_dir_all(&partial).with_context(|| format!("removing {}", partial.display()))?;
    }
    std::fs::create_dir_all(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let result = parts
        .iter()
        .enumerate()
        .map(|(i, (own, rep))| write_part(src, &manifest, &part_dir(&partial, i), own, rep))
        .collect::<Result<Vec<_>>>();
    match result {
        Ok(mut summaries) => {
            std::fs::rename(&partial, out)
                .with_context(|| format!("publishing {} as {}", partial.display(), out.display()))?;
            for (i, s) in summaries.iter_mut().enumerate() {
                s.path = part_dir(out, i);
            }
            Ok(summaries)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&partial);
            Err(e)
        }
    }
}

fn bytes_of<'a>(m: &Manifest, keys: impl Iterator<Item = &'a Key>) -> u64 {
    keys.filter_map(|&(l, e)| m.record(l, e)).map(Record::padded_len).sum()
}

/// One part: the other files linked (or copied), the records copied.
fn write_part(src: &Path, manifest: &Manifest, dir: &Path, own: &[Key], rep: &[Key]) -> Result<PartSummary> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for entry in std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default();
        if !path.is_file() || name == "manifest.json" || name == manifest.experts_file.as_str() {
            continue;
        }
        let to = dir.join(name);
        if std::fs::hard_link(&path, &to).is_err() {
            std::fs::copy(&path, &to).with_context(|| format!("copying {} to {}", path.display(), to.display()))?;
        }
    }
    let mut keys: Vec<Key> = own.iter().chain(rep).copied().collect();
    keys.sort_unstable();
    let experts_path = src.join(&manifest.experts_file);
    let mut input =
        std::fs::File::open(&experts_path).with_context(|| format!("opening {}", experts_path.display()))?;
    let out_path = dir.join(&manifest.experts_file);
    let mut output = std::io::BufWriter::new(
        std::fs::File::create(&out_path).with_context(|| format!("creating {}", out_path.display()))?,
    );
    let mut records = Vec::with_capacity(keys.len());
    let mut offset = 0u64;
    let mut buf = Vec::new();
    for (l, e) in keys {
        let Some(r) = manifest.record(l, e) else { continue };
        let n = r.padded_len();
        buf.resize(n as usize, 0);
        input.seek(SeekFrom::Start(r.offset))?;
        input
            .read_exact(&mut buf)
            .with_context(|| format!("reading layer {l} expert {e} from {}", experts_path.display()))?;
        output.write_all(&buf)?;
        records.push(Record { offset, ..r.clone() });
        offset += n;
        debug_assert_eq!(offset % RECORD_ALIGN, 0);
    }
    let file = output.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    let part = Manifest {
        records,
        experts_len: offset,
        ..manifest.clone()
    };
    let json = serde_json::to_vec_pretty(&part)?;
    std::fs::write(dir.join("manifest.json"), json).with_context(|| format!("writing {}", dir.display()))?;
    Manifest::open(dir).with_context(|| format!("checking the part {}", dir.display()))?;
    Ok(PartSummary {
        path: dir.to_path_buf(),
        owns: own.len(),
        replicas: rep.len(),
        expert_bytes: offset,
    })
}
