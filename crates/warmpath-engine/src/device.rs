//! `--device cpu|cuda[:N]` and `--dtype f32|bf16|f16`. CUDA needs a build with
//! the `cuda` feature; without it `cuda` is refused, before any model is loaded.

use crate::error::EngineError;
use candle_core::{DType, Device};

/// What `--device` names, before any device is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    Cpu,
    /// CUDA device `N` (`cuda` alone is `cuda:0`).
    Cuda(usize),
}

impl std::str::FromStr for DeviceSpec {
    type Err = EngineError;

    fn from_str(s: &str) -> Result<Self, EngineError> {
        let bad =
            || EngineError::Unsupported(format!("device {s:?} (expected cpu, cuda or cuda:N)"));
        match s {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            _ => {
                let n = s.strip_prefix("cuda:").ok_or_else(bad)?;
                n.parse().map(DeviceSpec::Cuda).map_err(|_| bad())
            }
        }
    }
}

impl DeviceSpec {
    pub fn open(self) -> Result<Device, EngineError> {
        match self {
            DeviceSpec::Cpu => Ok(Device::Cpu),
            DeviceSpec::Cuda(n) if cfg!(feature = "cuda") => {
                Device::new_cuda(n).map_err(|e| {
                    EngineError::Unsupported(format!("opening CUDA device {n}: {e}"))
                })
            }
            DeviceSpec::Cuda(_) => Err(EngineError::Unsupported(
                "--device cuda: this binary was built without CUDA; rebuild with \
                 `cargo build --release -p warmpath-engine --features cuda` (needs the CUDA toolkit)"
                    .into(),
            )),
        }
    }
}

/// Parses and opens `--device` in one step.
pub fn open_device(s: &str) -> Result<Device, EngineError> {
    s.parse::<DeviceSpec>()?.open()
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
        assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert_eq!("cuda:3".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(3));
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", "metal"] {
            let err = bad.parse::<DeviceSpec>().unwrap_err().to_string();
            assert!(err.contains("cpu, cuda or cuda:N"), "{bad}: {err}");
        }
        assert!(matches!(open_device("cpu").unwrap(), Device::Cpu));
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_says_how_to_get_it() {
        let err = open_device("cuda:0").unwrap_err();
        assert!(matches!(err, EngineError::Unsupported(_)));
        assert!(err.to_string().contains("--features cuda"), "{err}");
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
