//! `--device cpu|cuda[:N]` and `--dtype f32|bf16|f16`. CUDA needs a build with
//! the `cuda` feature; without it `cuda` is refused, before any model is loaded.

use crate::error::EngineError;
use candle_core::{DType, Device};

/// Opens what `--device` names: `cpu`, `cuda` (device 0) or `cuda:N`.
pub fn open_device(s: &str) -> Result<Device, EngineError> {
    let n = match s {
        "cpu" => return Ok(Device::Cpu),
        "cuda" => 0,
        _ => s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| {
                EngineError::Unsupported(format!("device {s:?} (expected cpu, cuda or cuda:N)"))
            })?,
    };
    if !cfg!(feature = "cuda") {
        return Err(EngineError::Unsupported(
            "--device cuda: this binary was built without CUDA; rebuild with \
             `cargo build --release -p warmpath-engine --features cuda` (needs the CUDA toolkit)"
                .into(),
        ));
    }
    Device::new_cuda(n)
        .map_err(|e| EngineError::Unsupported(format!("opening CUDA device {n}: {e}")))
}

/// Parses `--dtype`: `f32`, `bf16` or `f16`.
pub fn parse_dtype(s: &str) -> Result<DType, EngineError> {
    match s {
        "f32" | "float32" => Ok(DType::F32),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "f16" | "float16" => Ok(DType::F16),
        other => Err(EngineError::Unsupported(format!(
            "dtype {other:?} (expected f32, bf16 or f16)"
        ))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices() {
        assert!(matches!(open_device("cpu").unwrap(), Device::Cpu));
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", "metal"] {
            let err = open_device(bad).unwrap_err().to_string();
            assert!(err.contains("cpu, cuda or cuda:N"), "{bad}: {err}");
        }
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_says_how_to_get_it() {
        for good in ["cuda", "cuda:0", "cuda:3"] {
            let err = open_device(good).unwrap_err();
            assert!(matches!(err, EngineError::Unsupported(_)));
            assert!(err.to_string().contains("--features cuda"), "{err}");
        }
    }

    #[test]
    fn parses_dtypes() {
        assert_eq!(parse_dtype("bf16").unwrap(), DType::BF16);
        assert_eq!(parse_dtype("float16").unwrap(), DType::F16);
        assert_eq!(parse_dtype("f32").unwrap(), DType::F32);
        assert!(parse_dtype("int8")
            .unwrap_err()
            .to_string()
            .contains("int8"));
    }
}
