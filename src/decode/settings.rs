//! Every image-stage setting, once: its name at each front door, its unit, default and meaning,
//! and how it is read from text — as [`LOADER_SETTINGS`](crate::loader::LOADER_SETTINGS) is for
//! the loader.
//!
//! The doors: the Rust [`ImageSpec`] (whose [`Default`] is this table's defaults, and whose
//! [`train`](ImageSpec::train) and [`eval`](ImageSpec::eval) start from them), Python's
//! `Images(...)` keyword arguments, the C `gpufeed_images` struct (which
//! `gpufeed_images_default` fills from this table; names are numbers there, `c_codes`), and the
//! `--NAME` flags of `gpufeed bench decode`. Each door turns what it is given into text and
//! calls [`ImageSpec::from_settings`]; [`ImageSpec::values`] reads every value back, which is how
//! the tests hold each door to the table.

use super::resample::{Layout, PixelType};
use super::spec::{ImageSpec, Transform};
use crate::config::settings::yes_no;
use crate::config::FrontDoor;
use crate::error::{invalid, Result};

/// One image setting as the documentation and every front door name it.
#[derive(Debug, Clone, Copy)]
pub struct ImageSetting {
    /// The name: [`ImageSpec::set`], Python's `Images` keyword, the C field.
    pub name: &'static str,
    /// The unit of a number, or the values a name takes.
    pub unit: &'static str,
    /// The default, as [`ImageSpec::values`] prints it (`none`: absent).
    pub default: &'static str,
    /// The allowed whole numbers, inclusive (checked by [`ImageSpec::set`]).
    pub range: Option<(u64, u64)>,
    /// What the setting does.
    pub help: &'static str,
    /// The C door's numbers for the names this setting takes: number `i` is `c_codes[i]`
    /// (empty: the C field holds the value itself).
    pub c_codes: &'static [&'static str],
    /// The doors that do not take it, and why (empty: every door does).
    pub not_at: &'static [(FrontDoor, &'static str)],
}

impl ImageSetting {
    /// Whether `door` takes this setting.
    pub fn at(&self, door: FrontDoor) -> bool {
        !self.not_at.iter().any(|(d, _)| *d == door)
    }

    /// The name the C door's number `code` stands for, or an error listing the numbers.
    pub fn name_of_code(&self, code: u32) -> Result<&'static str> {
        self.c_codes.get(code as usize).copied().ok_or_else(|| {
            let each: Vec<String> = self
                .c_codes
                .iter()
                .enumerate()
                .map(|(i, n)| format!("{i} {n}"))
                .collect();
            invalid(format!("{} {code}: {}", self.name, each.join(", ")))
        })
    }

    /// The C door's number for `name` (one of `c_codes`).
    pub fn code_of(&self, name: &str) -> Option<u32> {
        self.c_codes
            .iter()
            .position(|n| *n == name)
            .map(|i| i as u32)
    }
}

const NOT_CLI_TRANSFORM: (FrontDoor, &str) = (
    FrontDoor::Cli,
    "bench decode's rows name their transform (gpufeed-train, gpufeed-eval) and keep \
     torchvision's parameters, as the Pillow rows they are compared with do",
);
const NOT_CLI_AS_TRAINED: (FrontDoor, &str) = (
    FrontDoor::Cli,
    "bench decode measures the stage as a trainer gets it",
);
const NOT_C_YET: (FrontDoor, &str) = (
    FrontDoor::C,
    "not in gpufeed_images yet: the table's default applies",
);
/// The most decode threads a spec may ask for.
pub const THREADS_MAX: u64 = 1024;
/// The most batches decoded ahead (each holds a whole batch tensor).
pub const PREFETCH_BATCHES_MAX: u64 = 64;
/// The longest side of an output.
pub const SIDE_MAX: u32 = 16384;
const TRAIN: &str = "train";
const EVAL: &str = "eval";

/// Every image setting, in the order [`ImageSpec::from_settings`] applies them (the transform
/// before its parameters, the size before the evaluation resize that derives from it).
pub const IMAGE_SETTINGS: &[ImageSetting] = &[
    ImageSetting {
        name: "transform",
        unit: "train or eval",
        default: TRAIN,
        range: None,
        help: "train: torchvision's RandomResizedCrop then RandomHorizontalFlip; eval: Resize \
               (the shorter side) then CenterCrop",
        c_codes: &[TRAIN, EVAL],
        not_at: &[NOT_CLI_TRANSFORM],
    },
    ImageSetting {
        name: "size",
        unit: "pixels: a side, or HEIGHTxWIDTH",
        default: "224",
        range: None,
        help: "the output's height and width",
        c_codes: &[],
        not_at: &[],
    },
    ImageSetting {
        name: "dtype",
        unit: "uint8, float16, bfloat16 or float32",
        default: "float32",
        range: None,
        help: "the element type (uint8: 0-255 pixels, not normalised)",
        c_codes: &["uint8", "float16", "bfloat16", "float32"],
        not_at: &[],
    },
    ImageSetting {
        name: "layout",
        unit: "nchw or nhwc",
        default: "nchw",
        range: None,
        help: "where channels go: [N, 3, H, W] (PyTorch's default) or [N, H, W, 3]",
        c_codes: &["nchw", "nhwc"],
        not_at: &[],
    },
    ImageSetting {
        name: "mean",
        unit: "three numbers, 0-1 scale",
        default: "0.485,0.456,0.406",
        range: None,
        help: "per-channel mean subtracted (float types; ImageNet's)",
        c_codes: &[],
        not_at: &[(
            FrontDoor::Cli,
            "bench decode normalises as the Pillow rows do",
        )],
    },
    ImageSetting {
        name: "std",
        unit: "three numbers above 0, 0-1 scale",
        default: "0.229,0.224,0.225",
        range: None,
        help: "per-channel standard deviation divided by (float types; ImageNet's)",
        c_codes: &[],
        not_at: &[(
            FrontDoor::Cli,
            "bench decode normalises as the Pillow rows do",
        )],
    },
    ImageSetting {
        name: "threads",
        unit: "threads",
        default: "0",
        range: Some((0, THREADS_MAX)),
        help: "decode threads; 0: GPUFEED_DECODE_THREADS if set, else this process's cores \
               shared by the ranks on the node (LOCAL_WORLD_SIZE)",
        c_codes: &[],
        not_at: &[],
    },
    ImageSetting {
        name: "scale",
        unit: "two numbers, 0-1",
        default: "0.08,1",
        range: None,
        help: "train: the crop's share of the image's area, drawn between these",
        c_codes: &[],
        not_at: &[NOT_CLI_TRANSFORM, NOT_C_YET],
    },
    ImageSetting {
        name: "ratio",
        unit: "two numbers above 0",
        default: "0.75,1.3333333333333333",
        range: None,
        help: "train: the crop's aspect ratio, drawn (log-uniformly) between these",
        c_codes: &[],
        not_at: &[NOT_CLI_TRANSFORM, NOT_C_YET],
    },
    ImageSetting {
        name: "flip_p",
        unit: "a probability",
        default: "0.5",
        range: None,
        help: "train: the chance a sample is mirrored",
        c_codes: &[],
        not_at: &[NOT_CLI_TRANSFORM, NOT_C_YET],
    },
    ImageSetting {
        name: "resize",
        unit: "pixels",
        default: "none",
        range: Some((1, SIDE_MAX as u64 * 4)),
        help: "eval: the shorter side before the centre crop; none: 8/7 of the output's longer \
               side (256 for 224)",
        c_codes: &[],
        not_at: &[NOT_CLI_TRANSFORM],
    },
    ImageSetting {
        name: "dct_scaling",
        unit: "true or false",
        default: "true",
        range: None,
        help: "JPEGs decoded at 1/2, 1/4 or 1/8 scale in the DCT domain where the crop stays \
               at least four times the output (the CPU stage)",
        c_codes: &[],
        not_at: &[NOT_CLI_AS_TRAINED, NOT_C_YET],
    },
    ImageSetting {
        name: "max_pixels",
        unit: "pixels",
        default: "67108864",
        range: Some((1, u64::MAX)),
        help: "an image declaring more pixels is refused (a per-sample error) before any \
               buffer is sized from it",
        c_codes: &[],
        not_at: &[
            (
                FrontDoor::Cli,
                "bench decode's images are far below the limit",
            ),
            NOT_C_YET,
        ],
    },
    ImageSetting {
        name: "prefetch_batches",
        unit: "batches",
        default: "2",
        range: Some((1, PREFETCH_BATCHES_MAX)),
        help: "batches decoded ahead of the one handed out",
        c_codes: &[],
        not_at: &[NOT_CLI_AS_TRAINED, NOT_C_YET],
    },
    ImageSetting {
        name: "hardware_decoder",
        unit: "true or false",
        default: "true",
        range: None,
        help: "device path: baseline JPEGs go to the GPU's hardware JPEG decoder where it has \
               one; false: every image takes the CUDA-core route (for comparisons)",
        c_codes: &[],
        not_at: &[
            (
                FrontDoor::C,
                "a comparison switch: bench decode's gpufeed-nohw rows",
            ),
            (
                FrontDoor::Cli,
                "bench decode's gpufeed-nohw rows turn it off",
            ),
        ],
    },
];

fn setting(name: &str) -> Result<&'static ImageSetting> {
    IMAGE_SETTINGS
        .iter()
        .find(|s| s.name == name)
        .ok_or_else(|| {
            let names: Vec<&str> = IMAGE_SETTINGS.iter().map(|s| s.name).collect();
            invalid(format!(
                "unknown image setting {name:?}; the settings are {}",
                names.join(", ")
            ))
        })
}

fn whole<T: std::str::FromStr>(name: &str, v: &str, what: &str) -> Result<T> {
    v.parse()
        .map_err(|_| invalid(format!("{name} {v:?}: expected {what}")))
}

fn real(name: &str, v: &str) -> Result<f64> {
    match v.parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(x),
        _ => Err(invalid(format!("{name} {v:?}: expected a number"))),
    }
}

/// `N` numbers separated by commas (Python's tuples and lists reach here written so).
fn reals<const N: usize>(name: &str, v: &str) -> Result<[f64; N]> {
    let parts: Vec<&str> = v
        .trim_matches(|c| c == '(' || c == ')' || c == '[' || c == ']')
        .split(',')
        .map(str::trim)
        .collect();
    if parts.len() != N {
        return Err(invalid(format!(
            "{name} {v:?}: expected {N} numbers separated by commas"
        )));
    }
    let mut out = [0.0; N];
    for (o, p) in out.iter_mut().zip(parts) {
        *o = real(name, p)?;
    }
    Ok(out)
}

/// A whole number in the setting's range.
fn count(o: &ImageSetting, v: &str, what: &str) -> Result<u64> {
    let n: u64 = whole(o.name, v, what)?;
    match o.range {
        Some((lo, hi)) if !(lo..=hi).contains(&n) => Err(invalid(format!(
            "{} {n}: expected {lo} to {hi} ({})",
            o.name, o.unit
        ))),
        _ => Ok(n),
    }
}

fn joined<T: std::fmt::Display>(xs: &[T]) -> String {
    xs.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn train_defaults() -> Transform {
    let two = |name| reals::<2>(name, setting(name).expect("in the table").default);
    let scale = two("scale").expect("the table's scale reads");
    let ratio = two("ratio").expect("the table's ratio reads");
    let flip_p = real("flip_p", setting("flip_p").expect("in the table").default)
        .expect("the table's flip_p reads");
    Transform::Train {
        scale: (scale[0], scale[1]),
        ratio: (ratio[0], ratio[1]),
        flip_p,
    }
}

impl PixelType {
    /// The element type named `v`: `uint8`, `float16`, `bfloat16`, `float32`, or the short and
    /// torch spellings every door takes (`u8`, `f16`/`half`, `bf16`, `f32`/`float`).
    pub fn parse(v: &str) -> Result<PixelType> {
        Ok(match v.trim().to_ascii_lowercase().as_str() {
            "uint8" | "u8" => PixelType::U8,
            "float16" | "f16" | "half" => PixelType::F16,
            "bfloat16" | "bf16" => PixelType::Bf16,
            "float32" | "f32" | "float" => PixelType::F32,
            _ => {
                return Err(invalid(format!(
                    "dtype {v:?}: expected {}",
                    setting("dtype").expect("in the table").unit
                )))
            }
        })
    }
}

impl Layout {
    /// The layout named `v`: `nchw` or `nhwc`.
    pub fn parse(v: &str) -> Result<Layout> {
        match v.trim().to_ascii_lowercase().as_str() {
            "nchw" => Ok(Layout::Nchw),
            "nhwc" => Ok(Layout::Nhwc),
            _ => Err(invalid(format!("layout {v:?}: expected nchw or nhwc"))),
        }
    }

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Nchw => "nchw",
            Layout::Nhwc => "nhwc",
        }
    }
}

impl Default for ImageSpec {
    /// The table's defaults: the training transform to 224×224, float32, NCHW, ImageNet's
    /// normalisation.
    fn default() -> Self {
        ImageSpec::read(&[]).expect("the table's defaults read")
    }
}

impl ImageSpec {
    /// The spec the table's defaults make, with `given` (name, value) over them, each read as
    /// [`set`](Self::set) reads it, in the table's order; then checked
    /// ([`validate`](Self::validate)). How every door builds its spec.
    pub fn from_settings(given: &[(&str, String)]) -> Result<ImageSpec> {
        let s = ImageSpec::read(given)?;
        s.validate()?;
        Ok(s)
    }

    /// [`from_settings`](Self::from_settings) unchecked (the defaults: `GPUFEED_DECODE_THREADS`
    /// is checked when a loader takes the spec, not when it is made).
    fn read(given: &[(&str, String)]) -> Result<ImageSpec> {
        for (k, _) in given {
            setting(k)?;
        }
        let mut s = ImageSpec {
            size: (1, 1),
            transform: train_defaults(),
            mean: [0.0; 3],
            std: [1.0; 3],
            dtype: PixelType::F32,
            layout: Layout::Nchw,
            threads: 0,
            prefetch_batches: 1,
            pixels_max: 1,
            dct_scaling: true,
            hardware_decoder: true,
        };
        for o in IMAGE_SETTINGS {
            let v = given
                .iter()
                .rev()
                .find(|(k, _)| *k == o.name)
                .map_or(o.default, |(_, v)| v.as_str());
            s.set(o.name, v)?;
        }
        Ok(s)
    }

    /// Sets `name` ([`IMAGE_SETTINGS`]) from text, as every door does. `transform` to a new
    /// one takes the table's parameters for it; the training parameters (`scale`, `ratio`,
    /// `flip_p`) do nothing to the evaluation transform, nor `resize` to the training one.
    /// The error names the setting and what it expects.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let o = setting(name)?;
        let v = value.trim();
        let none = v.is_empty() || v.eq_ignore_ascii_case("none");
        match o.name {
            "transform" => {
                self.transform = match (v.to_ascii_lowercase().as_str(), self.transform) {
                    (TRAIN, t @ Transform::Train { .. }) => t,
                    (TRAIN, _) => train_defaults(),
                    (EVAL, t @ Transform::Eval { .. }) => t,
                    (EVAL, _) => Transform::Eval {
                        resize: eval_resize(self.size),
                    },
                    _ => return Err(invalid(format!("transform {v:?}: expected {}", o.unit))),
                }
            }
            "size" => {
                let what = "a side in pixels, or HEIGHTxWIDTH";
                self.size = match v.split_once(['x', 'X', ',']) {
                    Some((h, w)) => (whole(name, w.trim(), what)?, whole(name, h.trim(), what)?),
                    None => {
                        let side = whole(name, v, what)?;
                        (side, side)
                    }
                }
            }
            "dtype" => self.dtype = PixelType::parse(v)?,
            "layout" => self.layout = Layout::parse(v)?,
            "mean" | "std" => {
                let [a, b, c] = reals::<3>(name, v)?;
                let x = [a as f32, b as f32, c as f32];
                if o.name == "mean" {
                    self.mean = x;
                } else {
                    self.std = x;
                }
            }
            "threads" => {
                self.threads = count(o, v, "a count of threads (0: the default)")? as usize
            }
            // Read and checked whatever the transform (a bad value is an error even where it
            // would not be used), applied to the one that uses it.
            "scale" => {
                let [a, b] = reals::<2>(name, v)?;
                super::spec::check_scale((a, b))?;
                if let Transform::Train { scale, .. } = &mut self.transform {
                    *scale = (a, b);
                }
            }
            "ratio" => {
                let [a, b] = reals::<2>(name, v)?;
                super::spec::check_ratio((a, b))?;
                if let Transform::Train { ratio, .. } = &mut self.transform {
                    *ratio = (a, b);
                }
            }
            "flip_p" => {
                let p = real(name, v)?;
                super::spec::check_flip_p(p)?;
                if let Transform::Train { flip_p, .. } = &mut self.transform {
                    *flip_p = p;
                }
            }
            "resize" => {
                let r = if none {
                    eval_resize(self.size)
                } else {
                    count(o, v, "a side in pixels, or none")? as u32
                };
                if let Transform::Eval { resize } = &mut self.transform {
                    *resize = r;
                }
            }
            "dct_scaling" => self.dct_scaling = yes_no(name, v)?,
            "max_pixels" => {
                // A count, or one with a unit (64M).
                self.pixels_max = match v.ends_with(|c: char| c.is_ascii_alphabetic()) {
                    true => crate::util::parse_size(v).map_err(|_| {
                        invalid(format!("max_pixels {v:?}: expected a count of pixels"))
                    })?,
                    false => count(o, v, "a count of pixels")?,
                }
            }
            "prefetch_batches" => {
                self.prefetch_batches = count(o, v, "a count of batches")? as usize
            }
            "hardware_decoder" => self.hardware_decoder = yes_no(name, v)?,
            other => unreachable!("image setting {other} has no reader"),
        }
        Ok(())
    }

    /// Every setting's value as text, in [`IMAGE_SETTINGS`] order (`None`: absent — the
    /// training parameters of an evaluation spec, the resize of a training one).
    pub fn values(&self) -> Vec<(&'static str, Option<String>)> {
        let train = match self.transform {
            Transform::Train {
                scale,
                ratio,
                flip_p,
            } => Some((scale, ratio, flip_p)),
            Transform::Eval { .. } => None,
        };
        IMAGE_SETTINGS
            .iter()
            .map(|o| {
                let v = match o.name {
                    "transform" => Some(if train.is_some() { TRAIN } else { EVAL }.to_string()),
                    "size" => Some(if self.size.0 == self.size.1 {
                        self.size.0.to_string()
                    } else {
                        format!("{}x{}", self.size.1, self.size.0)
                    }),
                    "dtype" => Some(self.dtype.as_str().to_string()),
                    "layout" => Some(self.layout.as_str().to_string()),
                    "mean" => Some(joined(&self.mean)),
                    "std" => Some(joined(&self.std)),
                    "threads" => Some(self.threads.to_string()),
                    "scale" => train.map(|(s, _, _)| joined(&[s.0, s.1])),
                    "ratio" => train.map(|(_, r, _)| joined(&[r.0, r.1])),
                    "flip_p" => train.map(|(_, _, p)| p.to_string()),
                    "resize" => match self.transform {
                        Transform::Eval { resize } => Some(resize.to_string()),
                        Transform::Train { .. } => None,
                    },
                    "dct_scaling" => Some(self.dct_scaling.to_string()),
                    "max_pixels" => Some(self.pixels_max.to_string()),
                    "prefetch_batches" => Some(self.prefetch_batches.to_string()),
                    "hardware_decoder" => Some(self.hardware_decoder.to_string()),
                    other => unreachable!("image setting {other} has no writer"),
                };
                (o.name, v)
            })
            .collect()
    }

    /// [`values`](Self::values) as a JSON object (`null`: absent), as `gpufeed bench decode
    /// --json`, Python's `Images.settings` and the C ABI's `gpufeed_loader_image_settings`
    /// print them.
    pub fn settings_json(&self) -> serde_json::Value {
        crate::util::values_json(self.values())
    }

    /// The table's defaults as [`settings_json`](Self::settings_json) prints them, for the
    /// settings `door` takes.
    pub fn defaults_json(door: FrontDoor) -> serde_json::Value {
        let all = ImageSpec::default().settings_json();
        serde_json::Value::Object(
            IMAGE_SETTINGS
                .iter()
                .filter(|o| o.at(door))
                .map(|o| (o.name.to_string(), all[o.name].clone()))
                .collect(),
        )
    }
}

/// The evaluation transform's shorter side before the crop to `size` (width, height): 8/7 of
/// the longer side, 256 for 224 as torchvision's ImageNet recipe has it — so that the centre
/// crop lies inside the resized image whatever the output's shape.
pub(super) fn eval_resize((w, h): (u32, u32)) -> u32 {
    (w.max(h) as u64 * 8 / 7) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_tables_and_every_setting_reads_back() {
        let d = ImageSpec::default();
        for (name, v) in d.values() {
            let o = setting(name).unwrap();
            assert_eq!(v.as_deref().unwrap_or("none"), o.default, "{name}");
        }
        assert_eq!(d, ImageSpec::train(224));
        // Every value read back is read as it was.
        let given: Vec<(&str, String)> = vec![
            ("transform", "eval".into()),
            ("size", "96x128".into()),
            ("dtype", "bf16".into()),
            ("layout", "nhwc".into()),
            ("mean", "0.5,0.25,0.125".into()),
            ("std", "(0.5, 0.5, 0.5)".into()),
            ("threads", "3".into()),
            ("resize", "140".into()),
            ("dct_scaling", "false".into()),
            ("max_pixels", "1M".into()),
            ("prefetch_batches", "4".into()),
            ("hardware_decoder", "false".into()),
        ];
        let s = ImageSpec::from_settings(&given).unwrap();
        assert_eq!(s.size, (128, 96));
        assert_eq!(s.transform, Transform::Eval { resize: 140 });
        assert_eq!(s.pixels_max, 1 << 20);
        let again: Vec<(&str, String)> = s
            .values()
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        assert_eq!(ImageSpec::from_settings(&again).unwrap(), s);
        // The evaluation resize follows the size where none is given.
        let s = ImageSpec::from_settings(&[("transform", "eval".into())]).unwrap();
        assert_eq!(s, ImageSpec::eval(224));
        assert_eq!(s.transform, Transform::Eval { resize: 256 });
    }

    #[test]
    fn every_alias_of_a_dtype_is_one_parse_and_bad_values_say_what_is_expected() {
        for (v, t) in [
            ("uint8", PixelType::U8),
            ("u8", PixelType::U8),
            ("half", PixelType::F16),
            ("f16", PixelType::F16),
            ("bf16", PixelType::Bf16),
            ("float", PixelType::F32),
            ("Float32", PixelType::F32),
        ] {
            assert_eq!(PixelType::parse(v).unwrap(), t, "{v}");
        }
        let e = PixelType::parse("int8").unwrap_err().to_string();
        assert!(e.contains("uint8, float16, bfloat16 or float32"), "{e}");
        for (k, v, says) in [
            ("size", "0x", "HEIGHTxWIDTH"),
            ("size", "0x64", "size 0x64 (height x width)"),
            ("prefetch_batches", "1000000000", "expected 1 to 64"),
            ("threads", "4294967296", "expected 0 to 1024"),
            ("resize", "-1", "resize \"-1\""),
            ("flip_p", "5", "flip_p 5"),
            ("max_pixels", "1.5", "max_pixels"),
            ("mean", "1,2", "3 numbers"),
            ("transform", "test", "train or eval"),
            ("colour", "rgb", "the settings are transform"),
        ] {
            let e = ImageSpec::from_settings(&[(k, v.into())])
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{k}={v}: {e}");
        }
        let dtype = setting("dtype").unwrap();
        assert_eq!(dtype.name_of_code(1).unwrap(), "float16");
        let e = dtype.name_of_code(7).unwrap_err().to_string();
        assert!(
            e.contains("dtype 7: 0 uint8, 1 float16, 2 bfloat16, 3 float32"),
            "{e}"
        );
    }
}
