//! The progress bar while a model opens: bytes of weights made so far
//! ([`charm_common::load_progress`]) against the model's size on disk, on
//! stderr, drawn only when stderr is a terminal. A GGUF file's repacked
//! copies (a 17 GB file takes tens of seconds) are most of that time.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use charm_common::container::Manifest;
use indicatif::{ProgressBar, ProgressStyle};

/// Runs `open` (which loads the model at `path`) with the bar showing.
pub fn while_loading<T>(path: &Path, open: impl FnOnce() -> T) -> T {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return open();
    }
    let total = model_bytes(path).max(1);
    let start = charm_common::load_progress::made();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("loading [{bar:40}] {bytes}/{total_bytes} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (bar, done) = (bar.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let made = charm_common::load_progress::made() - start;
                bar.set_position(made.min(total));
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let out = open();
    done.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    bar.finish_and_clear();
    out
}

/// Bytes of the weights at `path` that opening makes: a GGUF file's size,
/// a container's dense file (its experts stream later), or a Hugging Face
/// directory's safetensors files.
pub fn model_bytes(path: &Path) -> u64 {
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    if path.is_file() {
        return size(path);
    }
    if let Ok(m) = Manifest::open(path) {
        return size(&path.join(&m.dense_file));
    }
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .map(|p| size(&p))
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_is_sized_by_what_opening_reads() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(dir.join("model-00001.safetensors"), [0u8; 100]).unwrap();
        std::fs::write(dir.join("model-00002.safetensors"), [0u8; 50]).unwrap();
        std::fs::write(dir.join("config.json"), b"{}").unwrap();
        assert_eq!(model_bytes(dir), 150);
        let file = dir.join("m.gguf");
        std::fs::write(&file, [0u8; 7]).unwrap();
        assert_eq!(model_bytes(&file), 7);
        assert_eq!(model_bytes(&dir.join("missing")), 0);
    }
}
