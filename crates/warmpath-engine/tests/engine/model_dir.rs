//! `--model-dir` through the real loader: the project writes a Hugging Face
//! style model folder (random weights + the tiny tokenizer) and loads it back.
//!
//! - A folder written from seed S computes bit-identical logits to the
//!   in-memory `--tiny --seed S` model (same f32 weights, same code path), in
//!   f32 and in bf16, single file or sharded, with tied or separate LM head.
//! - The real `warmpath-engine` binary serves such a folder.
//! - Broken folders give clear errors naming the file and the problem.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use warmpath_core::tokenize::tiny;
use warmpath_engine::config::LlamaConfig;
use warmpath_engine::kv::KvState;
use warmpath_engine::model::Llama;
use warmpath_engine::model_dir::{write_random_model_dir, write_tiny_model_dir, ModelDirOptions};
use warmpath_engine::weights::random_weights;
use warmpath_engine::{load, EngineError, LoadedModel, ModelSource, SizePreset};

/// A fresh folder under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "warmpath-engine-test-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

fn prompt() -> Vec<u32> {
    (0..70u32)
        .map(|i| (i * 37 + 11) % tiny::VOCAB_SIZE as u32)
        .collect()
}

fn logits(model: &Llama) -> Vec<f32> {
    let (l, _) = model.forward(&prompt(), &KvState::default()).unwrap();
    l.to_dtype(DType::F32).unwrap().to_vec1().unwrap()
}

fn load_dir(dir: &Path, dtype: DType) -> Result<LoadedModel, EngineError> {
    load(&ModelSource::Dir(dir.to_owned()), &Device::Cpu, dtype)
}

fn tiny_model(seed: u64, dtype: DType) -> LoadedModel {
    load(
        &ModelSource::Random {
            size: SizePreset::Tiny,
            seed,
        },
        &Device::Cpu,
        dtype,
    )
    .unwrap()
}

#[test]
fn folder_model_is_bit_identical_to_the_in_memory_tiny_model() {
    let d = TempDir::new("f32");
    write_tiny_model_dir(&d, 7).unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(d.join(f).is_file(), "{f} written");
    }
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"], json!(["LlamaForCausalLM"]));
    assert_eq!(config["torch_dtype"], "float32");
    let tok_cfg = std::fs::read_to_string(d.join("tokenizer_config.json")).unwrap();
    assert!(tok_cfg.contains("chat_template"));

    let from_dir = load_dir(&d, DType::F32).unwrap();
    let in_memory = tiny_model(7, DType::F32);
    // The folder states head_dim explicitly; the shape is the same.
    let shape = LlamaConfig {
        head_dim: None,
        ..from_dir.model.config().clone()
    };
    assert_eq!(&shape, in_memory.model.config());
    assert_eq!(logits(&from_dir.model), logits(&in_memory.model));
    assert_ne!(
        logits(&from_dir.model),
        logits(&tiny_model(8, DType::F32).model)
    );
    assert_eq!(from_dir.stop_ids, in_memory.stop_ids);
    assert!(from_dir.stop_ids.contains(&tiny::EOT_ID_ID));
    // generation_config.json's eos_token_id (a list, as Llama 3.1's) adds stop ids.
    std::fs::write(
        d.join("generation_config.json"),
        r#"{"eos_token_id": [17, 1020]}"#,
    )
    .unwrap();
    let with_gen = load_dir(&d, DType::F32).unwrap();
    assert!(with_gen.stop_ids.contains(&17) && with_gen.stop_ids.contains(&1020));
    std::fs::write(d.join("generation_config.json"), r#"{"eos_token_id": "x"}"#).unwrap();
    let err = load_dir(&d, DType::F32).unwrap_err().to_string();
    assert!(err.contains("generation_config.json"), "{err}");
    std::fs::remove_file(d.join("generation_config.json")).unwrap();
    assert!(from_dir.tokenizer.has_chat_template());
    let text = tiny::corpus_slice(100, 300);
    assert_eq!(
        from_dir.tokenizer.encode_text(&text, true).unwrap(),
        in_memory.tokenizer.encode_text(&text, true).unwrap()
    );
}

#[test]
fn half_precision_folders_match_the_in_memory_model() {
    let cfg = LlamaConfig::tiny(tiny::VOCAB_SIZE);
    let write = |name: &str, dtype: DType| {
        let d = TempDir::new(name);
        let options = ModelDirOptions {
            seed: 3,
            dtype,
            shards: 1,
        };
        write_random_model_dir(&d, &cfg, &options).unwrap();
        let stored =
            candle_core::safetensors::load(d.join("model.safetensors"), &Device::Cpu).unwrap();
        assert_eq!(stored["model.embed_tokens.weight"].dtype(), dtype);
        d
    };
    // f16 files run in f16 exactly like the in-memory model in f16.
    let d = write("f16", DType::F16);
    let config = std::fs::read_to_string(d.join("config.json")).unwrap();
    assert!(config.contains(r#""torch_dtype": "float16""#), "{config}");
    let from_dir = load_dir(&d, DType::F16).unwrap();
    assert_eq!(from_dir.model.dtype(), DType::F16);
    assert_eq!(
        logits(&from_dir.model),
        logits(&tiny_model(3, DType::F16).model)
    );
    // bf16 files (bf16 does not run on candle's CPU backend: refused clearly)
    // are widened exactly to f32.
    let d = write("bf16", DType::BF16);
    let err = load_dir(&d, DType::BF16).unwrap_err();
    assert!(matches!(err, EngineError::Unsupported(_)), "{err}");
    assert!(err.to_string().contains("bf16"), "{err}");
    let widened = load_dir(&d, DType::F32).unwrap();
    let w = random_weights(&cfg, 3, DType::BF16, &Device::Cpu).unwrap();
    let reference =
        Llama::load(VarBuilder::from_tensors(w, DType::F32, &Device::Cpu), &cfg).unwrap();
    assert_eq!(logits(&widened.model), logits(&reference));
}

#[test]
fn sharded_folder_with_index_loads_the_same_weights() {
    let d = TempDir::new("sharded");
    let options = ModelDirOptions {
        seed: 5,
        dtype: DType::F32,
        shards: 3,
    };
    write_random_model_dir(&d, &LlamaConfig::tiny(tiny::VOCAB_SIZE), &options).unwrap();
    assert!(!d.join("model.safetensors").exists());
    assert!(d.join("model-00003-of-00003.safetensors").is_file());
    let index: Value = serde_json::from_str(
        &std::fs::read_to_string(d.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        index["weight_map"]["lm_head.weight"],
        "model-00003-of-00003.safetensors"
    );
    let from_dir = load_dir(&d, DType::F32).unwrap();
    assert_eq!(
        logits(&from_dir.model),
        logits(&tiny_model(5, DType::F32).model)
    );

    // The index must be right: a tensor listed in the wrong shard is refused.
    let mut bad = index.clone();
    bad["weight_map"]["lm_head.weight"] = json!("model-00001-of-00003.safetensors");
    std::fs::write(d.join("model.safetensors.index.json"), bad.to_string()).unwrap();
    let err = load_dir(&d, DType::F32).unwrap_err().to_string();
    assert!(
        err.contains("lm_head.weight") && err.contains("index.json"),
        "{err}"
    );
    // ... and shards may not point outside the folder.
    bad["weight_map"]["lm_head.weight"] = json!("../elsewhere.safetensors");
    std::fs::write(d.join("model.safetensors.index.json"), bad.to_string()).unwrap();
    let err = load_dir(&d, DType::F32).unwrap_err().to_string();
    assert!(err.contains("not a file name"), "{err}");
}

#[test]
fn tied_embeddings_need_no_lm_head() {
    let d = TempDir::new("tied");
    let mut cfg = LlamaConfig::tiny(tiny::VOCAB_SIZE);
    cfg.tie_word_embeddings = true;
    let options = ModelDirOptions {
        seed: 9,
        ..ModelDirOptions::default()
    };
    write_random_model_dir(&d, &cfg, &options).unwrap();
    let stored = candle_core::safetensors::load(d.join("model.safetensors"), &Device::Cpu).unwrap();
    assert!(!stored.contains_key("lm_head.weight"));
    let from_dir = load_dir(&d, DType::F32).unwrap();
    assert!(from_dir.model.config().tie_word_embeddings);
    let w = random_weights(&cfg, 9, DType::F32, &Device::Cpu).unwrap();
    let reference =
        Llama::load(VarBuilder::from_tensors(w, DType::F32, &Device::Cpu), &cfg).unwrap();
    assert_eq!(logits(&from_dir.model), logits(&reference));
}

/// Rewrites `model.safetensors` after `edit`.
fn edit_weights(dir: &Path, edit: impl FnOnce(&mut HashMap<String, Tensor>)) {
    let path = dir.join("model.safetensors");
    let mut w = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    edit(&mut w);
    candle_core::safetensors::save(&w, &path).unwrap();
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
}

/// Loads a freshly written tiny folder broken by `breaks`; the error text.
fn broken(name: &str, breaks: impl FnOnce(&Path)) -> String {
    let d = TempDir::new(name);
    write_tiny_model_dir(&d, 1).unwrap();
    breaks(&d);
    let err = load_dir(&d, DType::F32).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::BadModel { .. } | EngineError::Io { .. } | EngineError::Tokenizer(_)
        ),
        "{name}: {err:?}"
    );
    err.to_string()
}

#[test]
fn broken_folders_give_clear_errors() {
    let cases: Vec<(&str, String, &[&str])> = vec![
        (
            "no-config",
            broken("no-config", |d| {
                std::fs::remove_file(d.join("config.json")).unwrap()
            }),
            &["config.json"],
        ),
        (
            "no-weights",
            broken("no-weights", |d| {
                std::fs::remove_file(d.join("model.safetensors")).unwrap()
            }),
            &["no *.safetensors"],
        ),
        (
            "missing-tensor",
            broken("missing-tensor", |d| {
                edit_weights(d, |w| {
                    w.remove("model.layers.2.mlp.up_proj.weight");
                })
            }),
            &["model.layers.2.mlp.up_proj.weight"],
        ),
        (
            "wrong-shape",
            broken("wrong-shape", |d| {
                edit_weights(d, |w| {
                    let t = Tensor::zeros((64, 256), DType::F32, &Device::Cpu).unwrap();
                    w.insert("model.layers.0.self_attn.k_proj.weight".into(), t);
                })
            }),
            &["model.layers.0.self_attn.k_proj.weight", "shape"],
        ),
        (
            "integer-tensor",
            broken("integer-tensor", |d| {
                edit_weights(d, |w| {
                    let t = Tensor::zeros(256, DType::I64, &Device::Cpu).unwrap();
                    w.insert("model.norm.weight".into(), t);
                })
            }),
            &["model.norm.weight", "I64"],
        ),
        (
            "architecture",
            broken("architecture", |d| {
                edit_config(d, |c| {
                    c["architectures"] = json!(["MistralForCausalLM"]);
                    c["model_type"] = json!("mistral");
                })
            }),
            &["config.json", "MistralForCausalLM"],
        ),
        (
            "torch-dtype",
            broken("torch-dtype", |d| {
                edit_config(d, |c| c["torch_dtype"] = json!("float8_e4m3fn"))
            }),
            &["config.json", "float8_e4m3fn"],
        ),
        (
            "bad-json",
            broken("bad-json", |d| {
                std::fs::write(d.join("config.json"), "{\"vocab_size\": ").unwrap()
            }),
            &["config.json"],
        ),
        (
            "no-tokenizer",
            broken("no-tokenizer", |d| {
                std::fs::remove_file(d.join("tokenizer.json")).unwrap()
            }),
            &["tokenizer.json"],
        ),
    ];
    for (name, err, needles) in cases {
        for n in needles {
            assert!(err.contains(n), "{name}: {err:?} should mention {n:?}");
        }
    }
    let err = load_dir(Path::new("/nonexistent/warmpath-model"), DType::F32)
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/warmpath-model") && err.contains("not a folder"));
}

#[test]
fn a_tokenizer_larger_than_the_model_vocabulary_is_refused() {
    let d = TempDir::new("vocab");
    write_random_model_dir(&d, &LlamaConfig::tiny(500), &ModelDirOptions::default()).unwrap();
    let err = load_dir(&d, DType::F32).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer.json") && err.contains("1024") && err.contains("500"),
        "{err}"
    );
}

/// The real binary, started with `args`; the first stdout line and the child.
async fn spawn_engine(args: &[&str]) -> (String, tokio::process::Child) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_warmpath-engine"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
        .await
        .expect("engine did not start within 120 s")
        .unwrap()
        .unwrap_or_default();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (line, child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_a_model_folder() {
    let d = TempDir::new("served");
    write_tiny_model_dir(&d, 0).unwrap();
    let dir = d.to_str().unwrap();
    let (line, _child) = spawn_engine(&["--model-dir", dir, "--listen", "127.0.0.1:0"]).await;
    let base = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    let name = d.file_name().unwrap().to_str().unwrap().to_owned();
    let client = reqwest::Client::new();
    let models: Value = client
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], name.as_str());
    let system = tiny::corpus_slice(0, 800);
    let mut cached = Vec::new();
    for question in ["first question", "second question"] {
        let body = json!({"model": name, "max_tokens": 5, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": question}]});
        let r = client
            .post(format!("{base}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let v: Value = r.json().await.unwrap();
        assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
        assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 5);
        cached.push(
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
    }
    assert_eq!(cached[0], 0);
    assert!(
        cached[1] >= 128,
        "the shared system prompt was reused: {cached:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_refuses_bad_folders_and_devices_without_panicking() {
    let d = TempDir::new("refused");
    write_tiny_model_dir(&d, 0).unwrap();
    std::fs::remove_file(d.join("config.json")).unwrap();
    let dir = d.to_str().unwrap();
    for (args, needle) in [
        (
            vec!["--model-dir", dir, "--listen", "127.0.0.1:0"],
            "config.json",
        ),
        (
            vec!["--tiny", "--listen", "127.0.0.1:0", "--device", "tpu"],
            "cpu, cuda or cuda:N",
        ),
        (
            vec!["--tiny", "--listen", "127.0.0.1:0", "--dtype", "int4"],
            "int4",
        ),
    ] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_warmpath-engine"))
            .args(&args)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_writes_a_model_folder_that_loads() {
    let d = TempDir::new("written-by-cli");
    let dir = d.to_str().unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_warmpath-engine"))
        .args(["--write-model-dir", dir, "--seed", "4", "--shards", "2"])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(d.join("model.safetensors.index.json").is_file());
    let from_dir = load_dir(&d, DType::F32).unwrap();
    assert_eq!(
        logits(&from_dir.model),
        logits(&tiny_model(4, DType::F32).model)
    );
}
