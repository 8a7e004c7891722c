//! F32 tensors read in place from a memory-mapped safetensors file.
//!
//! Every PostgreSQL backend that embeds loads the model, so the weights must not be copied per process:
//! a copy costs each connection about 90 MB of private memory for MiniLM. Mapping the file read-only and
//! handing out `&[f32]` views into the mapping keeps every weight in the page cache, shared by all
//! processes that map the same file.
//!
//! A view is only sound when the tensor's bytes are 4-byte aligned in memory and the machine is
//! little-endian (safetensors stores little-endian values). Files written by the `safetensors` library
//! align every tensor, and the mapping itself starts on a page boundary, so the mapped path is the
//! normal one. A file that breaks either condition is decoded once into a private buffer instead, which
//! [`WeightFile::is_mapped`] reports.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::Dtype;

use crate::LocalModelError;

/// Where a tensor's values live: a range of f32 indices into [`WeightFile::values`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TensorRef {
    pub range: Range<usize>,
    pub shape: Vec<usize>,
}

enum Storage {
    /// Views point into the mapping; a [`TensorRef`]'s range counts f32 values from its first byte.
    Mapped(Mmap),
    /// The F32 tensors decoded into one private buffer, for unaligned files or big-endian machines.
    Decoded(Vec<f32>),
}

/// An opened safetensors file whose F32 tensors can be borrowed as slices.
pub(crate) struct WeightFile {
    path: PathBuf,
    storage: Storage,
    tensors: HashMap<String, TensorRef>,
}

impl WeightFile {
    pub fn open(path: &Path) -> Result<WeightFile, LocalModelError> {
        let io_error = |source| LocalModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io_error)?;
        // SAFETY: the mapping is read-only. Modifying or truncating model.safetensors while a process
        // maps it is unsupported; scripts/fetch-model replaces files by rename, never in place.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io_error)?;
        let (header_len, metadata) = safetensors::SafeTensors::read_metadata(&mmap)
            .map_err(|error| invalid(path, format!("unreadable safetensors header: {error}")))?;
        let data_start = 8usize
            .checked_add(header_len)
            .ok_or_else(|| invalid(path, "safetensors header length overflows"))?;

        let mut byte_ranges = Vec::new();
        for (name, info) in metadata.tensors() {
            if info.dtype != Dtype::F32 {
                // Other dtypes (BERT checkpoints carry an I64 position_ids buffer) are never read.
                continue;
            }
            let count = info
                .shape
                .iter()
                .try_fold(1usize, |total, &dimension| total.checked_mul(dimension));
            let start = data_start.checked_add(info.data_offsets.0);
            let end = data_start.checked_add(info.data_offsets.1);
            let (Some(count), Some(start), Some(end)) = (count, start, end) else {
                return Err(invalid(
                    path,
                    format!("tensor {name} has an impossible size"),
                ));
            };
            if end > mmap.len() || end < start || Some(end - start) != count.checked_mul(4) {
                return Err(invalid(
                    path,
                    format!("tensor {name} data range {start}..{end} does not fit its shape or the file"),
                ));
            }
            byte_ranges.push((name.clone(), start..end, info.shape.clone()));
        }

        let mappable = cfg!(target_endian = "little")
            && byte_ranges
                .iter()
                .all(|(_, bytes, _)| bytes.start.is_multiple_of(4))
            && (mmap.as_ptr() as usize).is_multiple_of(std::mem::align_of::<f32>());
        let mut tensors = HashMap::with_capacity(byte_ranges.len());
        let storage = if mappable {
            for (name, bytes, shape) in byte_ranges {
                let range = bytes.start / 4..bytes.end / 4;
                tensors.insert(name, TensorRef { range, shape });
            }
            Storage::Mapped(mmap)
        } else {
            let total = byte_ranges
                .iter()
                .map(|(_, bytes, _)| bytes.len() / 4)
                .sum();
            let mut values = Vec::with_capacity(total);
            for (name, bytes, shape) in byte_ranges {
                let first = values.len();
                values.extend(
                    mmap[bytes]
                        .chunks_exact(4)
                        .map(|value| f32::from_le_bytes([value[0], value[1], value[2], value[3]])),
                );
                tensors.insert(
                    name,
                    TensorRef {
                        range: first..values.len(),
                        shape,
                    },
                );
            }
            Storage::Decoded(values)
        };
        Ok(WeightFile {
            path: path.to_path_buf(),
            storage,
            tensors,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the weights are read in place from the page cache rather than from a private copy.
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped(_))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The tensor `name`, checked to have exactly `shape`.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<TensorRef, LocalModelError> {
        let tensor = self
            .tensors
            .get(name)
            .ok_or_else(|| invalid(&self.path, format!("no F32 tensor named {name}")))?;
        if tensor.shape != shape {
            return Err(invalid(
                &self.path,
                format!(
                    "tensor {name} has shape {:?}, config.json implies {shape:?}",
                    tensor.shape
                ),
            ));
        }
        Ok(tensor.clone())
    }

    /// The values of a tensor returned by [`WeightFile::tensor`] on this file.
    pub fn values(&self, tensor: &TensorRef) -> &[f32] {
        match &self.storage {
            Storage::Mapped(mmap) => {
                // SAFETY: `open` checked that the tensor's bytes lie inside the mapping, start on a
                // 4-byte boundary of an f32-aligned base, and hold exactly `range.len()` little-endian
                // f32 values on a little-endian machine. Every bit pattern is a valid f32. The mapping
                // is read-only and lives as long as `self`, which the returned borrow cannot outlive.
                unsafe {
                    let first = mmap.as_ptr().cast::<f32>().add(tensor.range.start);
                    std::slice::from_raw_parts(first, tensor.range.len())
                }
            }
            Storage::Decoded(values) => &values[tensor.range.clone()],
        }
    }
}

fn invalid(path: &Path, message: impl Into<String>) -> LocalModelError {
    LocalModelError::InvalidFile {
        path: path.to_path_buf(),
        message: message.into(),
    }
}
