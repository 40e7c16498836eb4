//! The dataset options, once: their names, defaults and meaning, and how each is set from text.
//!
//! Every front door goes through this table with the same names: the CLI's `--NAME` flags
//! (`_` written `-`), Python's keyword arguments, the C options struct's fields, and
//! [`OpenOptions::set`] in Rust. [`OpenOptions::values`] reads every effective value back, which
//! is how the tests check that an option given at any door reaches the dataset.

use std::path::PathBuf;

use super::tokens::TokenType;
use super::{Format, OpenOptions};
use crate::error::{invalid, Result};

/// One dataset option as the documentation and every front door name it.
#[derive(Debug, Clone, Copy)]
pub struct OptionDoc {
    /// The name: `OpenOptions::set`, Python keyword, C field; the CLI flag is `--` + it with
    /// `-` for `_`.
    pub name: &'static str,
    /// The CLI flag without its dashes: `name` with `-` for `_`.
    pub flag: &'static str,
    /// The default, as text.
    pub default: &'static str,
    /// What the option does, as the CLI help says it.
    pub help: &'static str,
    /// A yes/no option: a CLI flag without a value (`--strict`), `true`/`false` elsewhere.
    pub boolean: bool,
}

/// Every dataset option (the order of the CLI's help).
pub const DATASET_OPTIONS: &[OptionDoc] = &[
    OptionDoc {
        name: "format",
        flag: "format",
        default: "detected",
        help: "the dataset's format: packed, image-folder, webdataset, tfrecord, tokens, \
               megatron (default: detected from extensions and magic bytes; flat token files \
               always need tokens)",
        boolean: false,
    },
    OptionDoc {
        name: "payload",
        flag: "payload",
        default: "jpg,jpeg,png,webp",
        help: "WebDataset: extensions of the payload member, by preference",
        boolean: false,
    },
    OptionDoc {
        name: "label_ext",
        flag: "label-ext",
        default: "cls",
        help: "WebDataset: extension of the member holding the label as decimal text (none: \
               no labels)",
        boolean: false,
    },
    OptionDoc {
        name: "label_offset",
        flag: "label-offset",
        default: "0",
        help: "subtracted from every label read from the data (WebDataset label members, \
               TFRecord label features); TensorFlow's ImageNet converter writes 1..1000, so 1 \
               gives 0..999",
        boolean: false,
    },
    OptionDoc {
        name: "tfrecord_index",
        flag: "tfrecord-index",
        default: "NAME.idx beside each file, else a scan",
        help: "TFRecord: index file (offset size per line, as tfrecord2idx writes), or a \
               directory of NAME.idx files",
        boolean: false,
    },
    OptionDoc {
        name: "tfrecord_payload",
        flag: "tfrecord-payload",
        default: "image/encoded",
        help: "TFRecord: records are tf.train.Examples and a sample is this bytes feature \
               (none: the whole record, read raw)",
        boolean: false,
    },
    OptionDoc {
        name: "tfrecord_label",
        flag: "tfrecord-label",
        default: "image/class/label",
        help: "TFRecord: the int64 feature holding the label (none: no labels)",
        boolean: false,
    },
    OptionDoc {
        name: "tfrecord_recover",
        flag: "tfrecord-recover",
        default: "false",
        help: "TFRecord without an index: after a length whose checksum fails, resynchronise \
               and deliver the records found after it, flagged as recovered (they are not \
               proven: a record stored inside another's data looks the same)",
        boolean: true,
    },
    OptionDoc {
        name: "token_dtype",
        flag: "token-dtype",
        default: "u16 (flat files); Megatron files name their own",
        help: "token files: width of each token, u16 or u32",
        boolean: false,
    },
    OptionDoc {
        name: "seq_len",
        flag: "seq-len",
        default: "1024 (flat files); Megatron: one sample per sequence",
        help: "token files: tokens per window (a sample is seq_len + 1 tokens)",
        boolean: false,
    },
    OptionDoc {
        name: "stride",
        flag: "stride",
        default: "seq_len",
        help: "token files: tokens between window starts",
        boolean: false,
    },
    OptionDoc {
        name: "strict",
        flag: "strict",
        default: "false",
        help: "refuse to open a dataset in which indexing found any problem (a damaged header, \
               an index line past its file…) instead of opening what is sound and reporting \
               the rest",
        boolean: true,
    },
    OptionDoc {
        name: "cache_dir",
        flag: "cache-dir",
        default: "$GPUFEED_CACHE_DIR, else ~/.cache/gpufeed/objects",
        help: "remote datasets (s3://, gs://, az://, http(s)://): the node-wide cache on local \
               disk, shared by every rank on the node (put it on NVMe)",
        boolean: false,
    },
    OptionDoc {
        name: "cache_limit",
        flag: "cache-limit",
        default: "the limit last given to this cache, else 90% of its free disk space",
        help: "remote datasets: the most bytes the node cache holds (e.g. 500G); what does not \
               fit is read from the store each epoch, and what fits is never evicted",
        boolean: false,
    },
    OptionDoc {
        name: "cache_extent",
        flag: "cache-extent",
        default: "8M",
        help: "remote datasets: the unit fetched with one GET and cached (64K to 256M, a \
               multiple of 4K); a cache keeps the size it was made with (another one asked \
               for is said and not used)",
        boolean: false,
    },
];

/// `none` (any case) or an empty value turns an optional name off.
fn optional(value: &str) -> Option<String> {
    let v = value.trim();
    (!v.is_empty() && !v.eq_ignore_ascii_case("none")).then(|| v.to_string())
}

/// A file extension as given (`.JPG`, ` jpg`): without leading dots or spaces, lower case —
/// the same text however often it is written back and read again.
fn extension(e: &str) -> String {
    e.trim_start_matches(|c: char| c == '.' || c.is_whitespace())
        .trim_end()
        .to_lowercase()
}

fn yes_no(name: &str, value: &str) -> Result<bool> {
    if value.trim().is_empty() {
        return Ok(false); // the default of every yes/no option
    }
    crate::util::yes_no_word(value).ok_or_else(|| {
        invalid(format!(
            "dataset option {name}={value:?}: expected true or false"
        ))
    })
}

fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T> {
    value.trim().parse().map_err(|_| {
        invalid(format!(
            "dataset option {name}={value:?} is not a valid number"
        ))
    })
}

/// A token width by name.
pub(crate) fn token_type(value: &str) -> Result<TokenType> {
    match value.trim().to_ascii_lowercase().as_str() {
        "u16" | "uint16" => Ok(TokenType::U16),
        "u32" | "uint32" => Ok(TokenType::U32),
        _ => Err(invalid(format!(
            "token_dtype {value:?}: the token file's element type, u16 or u32 (the batch's \
             token pairs are int64 whatever it is)"
        ))),
    }
}

/// A format by name.
pub(crate) fn format(value: &str) -> Result<Format> {
    const ALL: [Format; 6] = [
        Format::Packed,
        Format::ImageFolder,
        Format::WebDataset,
        Format::TfRecord,
        Format::Tokens,
        Format::Megatron,
    ];
    let v = value.trim().to_ascii_lowercase();
    ALL.into_iter().find(|f| f.name() == v).ok_or_else(|| {
        invalid(format!(
            "unknown format {value:?}: expected one of {}",
            ALL.map(|f| f.name()).join(", ")
        ))
    })
}

impl OpenOptions {
    /// Sets the option `name` ([`DATASET_OPTIONS`]) from text, as the CLI, Python and C do.
    /// An empty value (or `none` for the optional names) restores the default where the default
    /// is "absent"; the error names the option and what it expects.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let d = OpenOptions::default();
        let v = value.trim();
        match name {
            "format" => self.format = optional(v).map(|f| format(&f)).transpose()?,
            "payload" => {
                let exts: Vec<String> = v
                    .split(',')
                    .map(extension)
                    .filter(|e| !e.is_empty())
                    .collect();
                self.webdataset.payload = if exts.is_empty() {
                    d.webdataset.payload
                } else {
                    exts
                };
            }
            "label_ext" => {
                self.webdataset.label = if v.is_empty() {
                    d.webdataset.label
                } else {
                    let ext = extension(v);
                    if ext.is_empty() {
                        return Err(invalid(format!(
                            "label_ext {v:?} names no extension (e.g. cls, or none)"
                        )));
                    }
                    optional(&ext)
                }
            }
            "label_offset" => self.label_offset = if v.is_empty() { 0 } else { number(name, v)? },
            "tfrecord_index" => self.tfrecord_index = optional(v).map(PathBuf::from),
            "tfrecord_payload" => {
                self.tfrecord_payload = if v.is_empty() {
                    d.tfrecord_payload
                } else {
                    optional(v)
                }
            }
            "tfrecord_label" => {
                self.tfrecord_label = if v.is_empty() {
                    d.tfrecord_label
                } else {
                    optional(v)
                }
            }
            "tfrecord_recover" => self.tfrecord_recover = yes_no(name, v)?,
            "strict" => self.strict = yes_no(name, v)?,
            "token_dtype" => self.tokens.dtype = optional(v).map(|t| token_type(&t)).transpose()?,
            "seq_len" => self.tokens.seq_len = optional(v).map(|n| number(name, &n)).transpose()?,
            "stride" => self.tokens.stride = optional(v).map(|n| number(name, &n)).transpose()?,
            "cache_dir" => self.cache_dir = optional(v).map(PathBuf::from),
            "cache_limit" => {
                self.cache_limit = optional(v)
                    .map(|n| {
                        crate::util::parse_size(&n)
                            .map_err(|e| invalid(format!("dataset option cache_limit={v:?}: {e}")))
                    })
                    .transpose()?
            }
            "cache_extent" => {
                self.cache_extent = if v.is_empty() {
                    d.cache_extent
                } else {
                    crate::util::parse_size(v)
                        .map_err(|e| invalid(format!("dataset option cache_extent={v:?}: {e}")))?
                }
            }
            _ => {
                let names: Vec<&str> = DATASET_OPTIONS.iter().map(|o| o.name).collect();
                return Err(invalid(format!(
                    "unknown dataset option {name:?}; the options are {}",
                    names.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// Every option's effective value as text, in [`DATASET_OPTIONS`] order (`None`: absent,
    /// i.e. detected or the format's own default).
    pub fn values(&self) -> Vec<(&'static str, Option<String>)> {
        DATASET_OPTIONS
            .iter()
            .map(|o| {
                let v = match o.name {
                    "format" => self.format.map(|f| f.name().to_string()),
                    "payload" => Some(self.webdataset.payload.join(",")),
                    "label_ext" => self.webdataset.label.clone(),
                    "label_offset" => Some(self.label_offset.to_string()),
                    "tfrecord_index" => self
                        .tfrecord_index
                        .as_ref()
                        .map(|p| p.display().to_string()),
                    "tfrecord_payload" => self.tfrecord_payload.clone(),
                    "tfrecord_label" => self.tfrecord_label.clone(),
                    "tfrecord_recover" => Some(self.tfrecord_recover.to_string()),
                    "strict" => Some(self.strict.to_string()),
                    "token_dtype" => self.tokens.dtype.map(|t| t.name().to_string()),
                    "seq_len" => self.tokens.seq_len.map(|n| n.to_string()),
                    "stride" => self.tokens.stride.map(|n| n.to_string()),
                    "cache_dir" => self.cache_dir.as_ref().map(|p| p.display().to_string()),
                    "cache_limit" => self.cache_limit.map(|n| n.to_string()),
                    "cache_extent" => Some(self.cache_extent.to_string()),
                    other => unreachable!("option {other} has no value reader"),
                };
                (o.name, v)
            })
            .collect()
    }

    /// Notes for the options given (not at their default) that a dataset of `format` does not
    /// read (`remote`: it is read through the node cache): `label_ext` on an ImageFolder was
    /// ignored without a word.
    pub(crate) fn unused(&self, format: Format, remote: bool) -> Vec<String> {
        let defaults = OpenOptions::default().values();
        self.values()
            .into_iter()
            .zip(defaults)
            .filter(|((_, v), (_, d))| v != d)
            .filter_map(|((name, v), _)| {
                let reads = match name {
                    "payload" | "label_ext" => format == Format::WebDataset,
                    "label_offset" => matches!(format, Format::WebDataset | Format::TfRecord),
                    "tfrecord_index" | "tfrecord_payload" | "tfrecord_label"
                    | "tfrecord_recover" => format == Format::TfRecord,
                    "token_dtype" | "seq_len" | "stride" => {
                        matches!(format, Format::Tokens | Format::Megatron)
                    }
                    "cache_dir" | "cache_limit" | "cache_extent" => remote,
                    _ => true,
                };
                (!reads).then(|| {
                    format!(
                        "option {name}={} does not apply to a {} {} dataset: not used",
                        v.unwrap_or_default(),
                        if remote { "remote" } else { "local" },
                        format.name()
                    )
                })
            })
            .collect()
    }

    /// [`values`](OpenOptions::values) as a JSON object (`null` for absent).
    pub fn to_json(&self) -> serde_json::Value {
        crate::util::values_json(self.values())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_sets_and_reads_back() {
        let mut o = OpenOptions::default();
        let given = [
            ("format", "tokens"),
            ("payload", "png,.JPG"),
            ("label_ext", "txt"),
            ("label_offset", "1"),
            ("tfrecord_index", "/idx"),
            ("tfrecord_payload", "jpeg"),
            ("tfrecord_label", "y"),
            ("tfrecord_recover", "true"),
            ("token_dtype", "u32"),
            ("seq_len", "64"),
            ("stride", "16"),
            ("strict", "yes"),
            ("cache_dir", "/nvme/cache"),
            ("cache_limit", "2G"),
            ("cache_extent", "1M"),
        ];
        assert_eq!(given.len(), DATASET_OPTIONS.len());
        for o in DATASET_OPTIONS {
            assert_eq!(o.flag, o.name.replace('_', "-"));
        }
        for (k, v) in given {
            o.set(k, v).unwrap();
        }
        let back: Vec<(&str, Option<String>)> = o.values();
        let want: Vec<(&str, Option<String>)> = vec![
            ("format", Some("tokens".into())),
            ("payload", Some("png,jpg".into())),
            ("label_ext", Some("txt".into())),
            ("label_offset", Some("1".into())),
            ("tfrecord_index", Some("/idx".into())),
            ("tfrecord_payload", Some("jpeg".into())),
            ("tfrecord_label", Some("y".into())),
            ("tfrecord_recover", Some("true".into())),
            ("token_dtype", Some("u32".into())),
            ("seq_len", Some("64".into())),
            ("stride", Some("16".into())),
            ("strict", Some("true".into())),
            ("cache_dir", Some("/nvme/cache".into())),
            ("cache_limit", Some((2u64 << 30).to_string())),
            ("cache_extent", Some((1u64 << 20).to_string())),
        ];
        assert_eq!(back, want);
        // `none` turns the optional ones off; empty restores defaults.
        o.set("tfrecord_payload", "none").unwrap();
        o.set("label_ext", "None").unwrap();
        assert_eq!(o.tfrecord_payload, None);
        assert_eq!(o.webdataset.label, None);
        o.set("tfrecord_payload", "").unwrap();
        assert_eq!(o.tfrecord_payload.as_deref(), Some("image/encoded"));
        assert!(o
            .set("seq_len", "many")
            .unwrap_err()
            .to_string()
            .contains("seq_len"));
        assert!(o
            .set("colour", "red")
            .unwrap_err()
            .to_string()
            .contains("token_dtype"));
        assert!(o
            .set("format", "zip")
            .unwrap_err()
            .to_string()
            .contains("webdataset"));
    }
}
