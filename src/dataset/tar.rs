//! WebDataset shards: uncompressed tar files (ustar, GNU long names, pax headers) whose members
//! are grouped into samples by key, as the webdataset library does.
//!
//! A member `dir/000123.seg.png` has key `dir/000123` and extension `seg.png` (the key ends at
//! the first dot of the file name; extensions are compared in lower case). Consecutive members
//! with the same key form one sample. The sample's bytes are its *payload* member, the first
//! extension of [`TarOptions::payload`] the sample has (`jpg` by default); its label is the
//! decimal integer in its [`TarOptions::label`] member (`cls`). Members that are not regular
//! files, names without an extension, and `__name__` metadata files are skipped, as webdataset
//! skips them.
//!
//! Tars are indexed by walking their headers (no index file exists); sample bytes are never
//! read, except the small label members. A damaged header is reported as a
//! [problem](super::Dataset::problems) and the walk resumes at the next block that is a valid
//! header, so one bad header costs only the samples it covered.

use super::Sources;
use std::path::{Path, PathBuf};

use super::{index_files, Builder, Dataset, Format, Sample, Window, WINDOW_MAX};
use crate::error::{invalid, Result};
use crate::util::Unpoison;

/// How tar members become samples.
#[derive(Debug, Clone)]
pub struct TarOptions {
    /// Extensions of the payload member, by preference (lower case, without the dot).
    pub payload: Vec<String>,
    /// Extension of the member holding the label as decimal text; `None`: no labels.
    pub label: Option<String>,
    /// Subtracted from every label read (`OpenOptions::label_offset` sets it).
    pub label_offset: i64,
}

impl Default for TarOptions {
    fn default() -> Self {
        TarOptions {
            payload: ["jpg", "jpeg", "png", "webp"].map(String::from).to_vec(),
            label: Some("cls".into()),
            label_offset: 0,
        }
    }
}

const BLOCK: u64 = 512;
/// Longest GNU long name or label member read; pax headers may use the whole window.
const NAME_MAX: u64 = 64 << 10;
const LABEL_MAX: u64 = 64;

/// The first line of a kept tar index, and the most bytes one may have (1 GiB: about 15 million
/// members).
#[cfg_attr(
    not(feature = "remote"),
    allow(
        dead_code,
        reason = "used only with feature remote: tar walks kept in the node cache"
    )
)]
const INDEX_MAGIC: &str = "gpufeed-tar-index 2";
#[cfg_attr(
    not(feature = "remote"),
    allow(
        dead_code,
        reason = "used only with feature remote: tar walks kept in the node cache"
    )
)]
pub(crate) const INDEX_BYTES_MAX: u64 = 1 << 30;
/// The name a tar's index is kept under beside it: `NAME.gpfidx`.
#[cfg_attr(
    not(feature = "remote"),
    allow(
        dead_code,
        reason = "used only with feature remote: tar walks kept in the node cache"
    )
)]
pub const INDEX_SUFFIX: &str = ".gpfidx";

/// Bytes as text without spaces or line breaks: printable ASCII but `%` stays, the rest is
/// `%XX`.
#[cfg_attr(
    not(feature = "remote"),
    allow(
        dead_code,
        reason = "used only with feature remote: tar walks kept in the node cache"
    )
)]
fn esc(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    for &c in b {
        if c.is_ascii_graphic() && c != b'%' {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

#[cfg_attr(
    not(feature = "remote"),
    allow(
        dead_code,
        reason = "used only with feature remote: tar walks kept in the node cache"
    )
)]
fn unesc(s: &str) -> std::result::Result<Vec<u8>, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or("a cut %XX escape")?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| format!("bad escape %{hex}"))?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

#[cfg_attr(
    not(feature = "remote"),
    allow(
        dead_code,
        reason = "used only with feature remote: tar walks kept in the node cache"
    )
)]
impl TarWalk {
    /// The walk as a kept index: text, a line each (`m HEADER DATA LEN NAME [xHEX]` per member,
    /// `p OFFSET MESSAGE` per problem, `n NOTE`), headed by the tar's size and `etag` (the
    /// version it describes) and ended by the member count, so a cut index is refused.
    pub fn to_text(&self, etag: &str) -> String {
        let mut t = format!(
            "{INDEX_MAGIC}\nsize {}\netag {}\n",
            self.size,
            esc(etag.as_bytes())
        );
        for m in &self.members {
            t.push_str(&format!(
                "m {} {} {} {}",
                m.header,
                m.data,
                m.len,
                esc(&m.name)
            ));
            if let Some(b) = &m.small {
                t.push_str(" x");
                for c in b {
                    t.push_str(&format!("{c:02x}"));
                }
            }
            t.push('\n');
        }
        for (at, msg) in &self.problems {
            t.push_str(&format!("p {at} {}\n", esc(msg.as_bytes())));
        }
        for n in &self.notes {
            t.push_str(&format!("n {}\n", esc(n.as_bytes())));
        }
        // The crc32c of every byte before the end line: a kept index is a cache file and a
        // stored one crossed a network, and a flipped digit in a length or a name would
        // otherwise pass every other check and serve wrong bytes.
        let crc = crate::crc32c::crc32c(t.as_bytes());
        t.push_str(&format!("end {} {crc:08x}\n", self.members.len()));
        t
    }

    /// Reads a kept index of a tar of `size` bytes and ETag `etag`: its crc32c and every line
    /// checked (offsets inside the tar, small members' bytes as long as they say); `Err` says
    /// why it cannot be used (another version of the tar, damage, a cut).
    pub fn from_text(text: &[u8], size: u64, etag: &str) -> std::result::Result<TarWalk, String> {
        let text = std::str::from_utf8(text).map_err(|_| "not UTF-8 text")?;
        let mut lines = text.lines();
        match lines.next() {
            Some(INDEX_MAGIC) => {}
            Some(l) if l.starts_with("gpufeed-tar-index ") => {
                return Err(format!(
                    "{l:?} is another version of the format ({INDEX_MAGIC:?})"
                ))
            }
            _ => return Err(format!("does not start with {INDEX_MAGIC:?}")),
        }
        // The end line is the last: "end COUNT CRC", the crc32c of every byte before it.
        let body = text
            .strip_suffix('\n')
            .ok_or("it is cut short (no end line)")?;
        let end_at = body.rfind('\n').map_or(0, |i| i + 1);
        let crc_ok = body[end_at..]
            .strip_prefix("end ")
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|c| u32::from_str_radix(c, 16).ok())
            .is_some_and(|c| c == crate::crc32c::crc32c(&text.as_bytes()[..end_at]));
        if !crc_ok {
            return Err(if body[end_at..].starts_with("end ") {
                "its checksum does not match (damaged)".into()
            } else {
                "it is cut short (no end line)".into()
            });
        }
        let field = |l: Option<&str>, name: &str| -> std::result::Result<String, String> {
            l.and_then(|l| l.strip_prefix(name))
                .and_then(|l| l.strip_prefix(' '))
                .map(str::to_string)
                .ok_or_else(|| format!("no {name} line"))
        };
        let got_size: u64 = field(lines.next(), "size")?
            .parse()
            .map_err(|_| "a bad size line")?;
        let got_etag = unesc(&field(lines.next(), "etag")?)?;
        if got_size != size || got_etag != etag.as_bytes() {
            return Err(format!(
                "it describes a tar of {got_size} bytes, ETag {}; the tar is {size} bytes, ETag {etag}",
                String::from_utf8_lossy(&got_etag)
            ));
        }
        let mut walk = TarWalk {
            size,
            ..TarWalk::default()
        };
        let num = |s: Option<&str>| -> std::result::Result<u64, String> {
            s.and_then(|s| s.parse().ok())
                .ok_or_else(|| "a bad number".to_string())
        };
        for (k, line) in lines.enumerate() {
            let at = |e: String| format!("line {}: {e}", k + 4);
            let mut f = line.split(' ');
            match f.next() {
                Some("m") => {
                    let header = num(f.next()).map_err(at)?;
                    let data = num(f.next()).map_err(at)?;
                    let len = num(f.next()).map_err(at)?;
                    let name = unesc(f.next().unwrap_or("")).map_err(at)?;
                    if header + BLOCK > data || data.checked_add(len).is_none_or(|e| e > size) {
                        return Err(at(format!("member at {data}+{len} does not fit the tar")));
                    }
                    if name.is_empty() || name.len() as u64 > NAME_MAX {
                        return Err(at("a member without a name".into()));
                    }
                    let small = match f.next() {
                        Some(x) => {
                            let hex = x.strip_prefix('x').ok_or_else(|| at("bad bytes".into()))?;
                            if hex.len() as u64 != 2 * len || len > LABEL_MAX {
                                return Err(
                                    at("small member bytes do not match its length".into()),
                                );
                            }
                            let b: std::result::Result<Vec<u8>, _> = (0..hex.len())
                                .step_by(2)
                                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
                                .collect();
                            Some(b.map_err(|_| at("bad hex".into()))?)
                        }
                        None => None,
                    };
                    walk.members.push(WalkMember {
                        name,
                        header,
                        data,
                        len,
                        small,
                    });
                }
                Some("p") => {
                    let off = num(f.next()).map_err(at)?;
                    let msg = unesc(f.next().unwrap_or("")).map_err(at)?;
                    walk.problems
                        .push((off, String::from_utf8_lossy(&msg).into_owned()));
                }
                Some("n") => {
                    let note = unesc(f.next().unwrap_or("")).map_err(at)?;
                    walk.notes.push(String::from_utf8_lossy(&note).into_owned());
                }
                Some("end") => {
                    // The checksum above covered every line before this one.
                    let n = num(f.next()).map_err(at)?;
                    if n != walk.members.len() as u64 {
                        return Err(at(format!(
                            "says {n} members, holds {}",
                            walk.members.len()
                        )));
                    }
                    return Ok(walk);
                }
                _ => return Err(at("an unknown line".into())),
            }
        }
        Err("it is cut short (no end line)".into())
    }
}

/// A sample being assembled from consecutive members.
struct Pending {
    key: Vec<u8>,
    exts: Vec<String>,
    payload: Option<(usize, u64, u64)>, // rank in TarOptions::payload, offset, len
    label: Option<i64>,
    /// Offset of the header of the sample's first member (where a problem with it is).
    header: u64,
}

/// A regular member a walk found: its name, where its header and data lie, and — for a small
/// member, which may be a label — its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WalkMember {
    pub name: Vec<u8>,
    pub header: u64,
    pub data: u64,
    pub len: u64,
    pub small: Option<Vec<u8>>,
}

/// What walking a tar's headers found, before members become samples (so it holds for any
/// [`TarOptions`], and can be kept: in the node cache, or beside the tar in its store as
/// `NAME.gpfidx` — see [`TarWalk::to_text`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TarWalk {
    /// The tar's size when it was walked.
    pub size: u64,
    pub members: Vec<WalkMember>,
    /// Damage found, at its offset.
    pub problems: Vec<(u64, String)>,
    /// What the file's path is said with.
    pub notes: Vec<String>,
}

/// Indexes WebDataset tars as one dataset, in the order given, their walks had from `src`
/// (walked here, or a remote tar's kept index: [`Sources::walk_tar`]).
pub(crate) fn open_walked(paths: &[PathBuf], opts: &TarOptions, src: &Sources) -> Result<Dataset> {
    if opts.payload.is_empty() {
        return Err(invalid("name at least one payload extension"));
    }
    let seen = std::sync::Mutex::new(Vec::new());
    // One unreadable tar among many is a problem, not the end of the dataset.
    let b = index_files(paths, src, |p, b| {
        let mut mine = Vec::new();
        let r = src
            .walk_tar(p)
            .and_then(|w| assemble(&w, p, opts, b, &mut mine));
        let mut all = seen.lock().unpoisoned();
        for x in mine {
            if all.len() < 20 && !all.contains(&x) {
                all.push(x);
            }
        }
        r
    })?;
    let mut seen = seen.into_inner().unpoisoned();
    seen.sort();
    if b.samples.is_empty() && b.problems_total > 0 && !seen.is_empty() {
        let list: Vec<String> = seen.iter().map(|s| format!(".{s}")).collect();
        return Err(invalid(format!(
            "no sample has a member with extension {} (members seen: {}); name the payload \
             extension (--payload)",
            opts.payload.join("|"),
            list.join(" ")
        ))
        .with_path(paths[0].clone()));
    }
    let mut ds = b.finish(Format::WebDataset, "these tar files")?;
    // A label extension that no member has (a misspelling: `clss`, `.label` for `.cls`) would
    // make every label -1 without a word: refused where it was named, a note for the default
    // (`cls`; unlabelled sets are common). Only where every label is -1 and every extension
    // was recorded (at most 20 are).
    if let Some(l) = &opts.label {
        let missing = ds.samples().iter().filter(|s| s.label == -1).count();
        let unlabelled = missing == ds.len();
        // Some labelled, some not: a sample without its label member is otherwise silent.
        if missing > 0 && !unlabelled {
            ds.notes.push(format!(
                "{missing} of {} samples have no usable .{l} label: their label is -1",
                ds.len()
            ));
        }
        if unlabelled && !seen.contains(l) && seen.len() < 20 {
            let list: Vec<String> = seen.iter().map(|s| format!(".{s}")).collect();
            let what = format!(
                "no sample has a .{l} member to read its label from (members seen: {})",
                list.join(" ")
            );
            if l != "cls" {
                return Err(invalid(format!(
                    "{what}; name the label member's extension (label_ext), or none for no \
                     labels"
                ))
                .with_path(paths[0].clone()));
            }
            ds.notes.push(format!(
                "{what}: every label is -1 (label_ext names another member)"
            ));
        }
    }
    Ok(ds)
}

/// Walks a tar's headers (through a [`Window`]: a remote tar's are fetched by ranged GETs, not
/// whole extents): every regular member, with the bytes of the small ones; a damaged header is
/// a problem and the walk resumes at the next valid one.
pub(crate) fn walk_tar(path: &Path, src: &Sources) -> Result<TarWalk> {
    let mut w = Window::open(path, src)?;
    let size = w.size;
    if size == 0 {
        return Err(invalid("empty file: not a tar").with_path(path.to_path_buf()));
    }
    let first = w.get(0, 2.min(size as usize))?;
    if first.starts_with(&[0x1f, 0x8b]) {
        return Err(invalid(
            "gzip-compressed tar: gpufeed reads byte ranges of uncompressed tars; decompress it \
             or pack it (gpufeed pack)",
        )
        .with_path(path.to_path_buf()));
    }
    let mut walk = TarWalk {
        size,
        ..TarWalk::default()
    };
    let mut pos = 0u64;
    let mut long_name: Option<Vec<u8>> = None;
    let mut pax = Pax::default();
    let mut last_name: Vec<u8> = Vec::new();
    let mut headers = 0u64;
    loop {
        if pos + BLOCK > size {
            if pos < size {
                walk.problems.push((
                    pos,
                    format!(
                        "{} stray bytes after the last member: the tar is truncated",
                        size - pos
                    ),
                ));
            } else if headers > 0 {
                // Every member found is whole, but the end-of-archive blocks that tar writers
                // put last are missing: the file may have been cut at a member boundary.
                walk.notes.push(format!(
                    "ends after {headers} headers without tar's end-of-archive blocks; it may \
                     have been cut short (every sample found is whole)"
                ));
            }
            break;
        }
        let h: [u8; 512] = w.get(pos, 512)?.try_into().expect("512 bytes");
        if h.iter().all(|&x| x == 0) {
            break; // end of archive
        }
        let own_size = if checksum_ok(&h) {
            number(&h[124..136])
        } else {
            None
        };
        let Some(own_size) = own_size else {
            let after = if headers == 0 {
                "at the start of the file".to_string()
            } else {
                format!("after member {:?}", String::from_utf8_lossy(&last_name))
            };
            let found = resync(&mut w, pos + BLOCK)?;
            if headers == 0 && found.is_none() {
                return Err(
                    invalid("not a tar file (no valid tar header)").with_path(path.to_path_buf())
                );
            }
            walk.problems.push((
                pos,
                format!(
                    "corrupt tar header {after} (bad checksum or size field); skipped to the \
                     next valid header"
                ),
            ));
            long_name = None;
            pax = Pax::default();
            match found {
                Some(p) => {
                    pos = p;
                    continue;
                }
                None => break,
            }
        };
        headers += 1;
        let typ = h[156];
        let is_meta = matches!(typ, b'L' | b'K' | b'x' | b'g');
        let msize = if is_meta {
            own_size
        } else {
            pax.size.unwrap_or(own_size)
        };
        let data = pos + BLOCK;
        let next = msize
            .checked_add(BLOCK - 1)
            .map(|s| s / BLOCK * BLOCK)
            .and_then(|s| data.checked_add(s));
        let name = || -> Vec<u8> {
            pax.path
                .clone()
                .or_else(|| long_name.clone())
                .unwrap_or_else(|| header_name(&h))
        };
        let Some(next) = next.filter(|_| data + msize <= size) else {
            walk.problems.push((
                pos,
                format!(
                    "member {:?} of {msize} bytes runs past the end of the file ({size} bytes): \
                     the tar is truncated",
                    String::from_utf8_lossy(&name())
                ),
            ));
            break;
        };
        match typ {
            b'L' => {
                if msize > NAME_MAX {
                    walk.problems
                        .push((pos, format!("GNU long name of {msize} bytes ignored")));
                } else {
                    let d = w.get(data, msize as usize)?;
                    long_name = Some(d.split(|&c| c == 0).next().unwrap_or(&[]).to_vec());
                }
            }
            b'x' => {
                if msize > WINDOW_MAX as u64 {
                    walk.problems
                        .push((pos, format!("pax header of {msize} bytes ignored")));
                } else {
                    match parse_pax(w.get(data, msize as usize)?) {
                        Ok(p) => pax = p,
                        Err(m) => walk
                            .problems
                            .push((pos, format!("malformed pax header ignored: {m}"))),
                    }
                }
            }
            b'K' | b'g' => {}
            b'0' | 0 | b'7' if !pax.sparse => {
                let n = name();
                let small = if msize <= LABEL_MAX {
                    Some(w.get(data, msize as usize)?.to_vec())
                } else {
                    None
                };
                walk.members.push(WalkMember {
                    name: n.clone(),
                    header: pos,
                    data,
                    len: msize,
                    small,
                });
                last_name = n;
            }
            _ => {
                last_name = name(); // directories, links, devices, sparse files: no data
            }
        }
        if !is_meta {
            long_name = None;
            pax = Pax::default();
        }
        pos = next;
    }
    Ok(walk)
}

/// Makes samples of a walk's members, as `opts` says, into `b`.
fn assemble(
    walk: &TarWalk,
    path: &Path,
    opts: &TarOptions,
    b: &mut Builder,
    seen: &mut Vec<String>,
) -> Result<()> {
    let fi = b.file(path, walk.size)?;
    let file_path = super::shared_path(path);
    let problem = |b: &mut Builder, offset: u64, msg: String| b.problem_at(&file_path, offset, msg);
    for (at, msg) in &walk.problems {
        problem(b, *at, msg.clone());
    }
    for n in &walk.notes {
        b.notes.push(format!("{}: {n}", path.display()));
    }
    let mut cur: Option<Pending> = None;
    for m in &walk.members {
        member(m, opts, fi, b, &mut cur, seen, &problem)?;
    }
    flush(cur.take(), fi, opts, b, &problem)?;
    Ok(())
}

/// One regular member: group it into the current sample.
fn member(
    m: &WalkMember,
    opts: &TarOptions,
    fi: u32,
    b: &mut Builder,
    cur: &mut Option<Pending>,
    seen: &mut Vec<String>,
    problem: &dyn Fn(&mut Builder, u64, String),
) -> Result<()> {
    let (name, data, len, header) = (&m.name[..], m.data, m.len, m.header);
    let base_at = name.iter().rposition(|&c| c == b'/').map_or(0, |i| i + 1);
    let base = &name[base_at..];
    if base_at == 0 && base.starts_with(b"__") && base.ends_with(b"__") {
        return Ok(()); // webdataset's metadata members
    }
    // The key ends at the first dot of the file name; a name without one has no extension.
    let Some(dot) = base.iter().position(|&c| c == b'.').filter(|&d| d > 0) else {
        return Ok(());
    };
    let key = &name[..base_at + dot];
    let ext = String::from_utf8_lossy(&base[dot + 1..]).to_lowercase();
    if seen.len() < 20 && !seen.contains(&ext) {
        seen.push(ext.clone());
    }
    if cur.as_ref().is_none_or(|c| c.key != key) {
        flush(cur.take(), fi, opts, b, problem)?;
        *cur = Some(Pending {
            key: key.to_vec(),
            exts: Vec::new(),
            payload: None,
            label: None,
            header,
        });
    }
    let c = cur.as_mut().expect("a sample is open");
    if c.exts.contains(&ext) {
        problem(
            b,
            header,
            format!(
                "duplicate member .{ext} in sample {:?}: the second is ignored",
                String::from_utf8_lossy(key)
            ),
        );
        return Ok(());
    }
    c.exts.push(ext.clone());
    if opts.label.as_deref() == Some(ext.as_str()) {
        let text = m
            .small
            .as_deref()
            .filter(|_| len <= LABEL_MAX)
            .and_then(|text| std::str::from_utf8(text).ok())
            .map(str::trim);
        match text.map(|t| t.parse::<i64>()) {
            Some(Ok(l)) => c.label = Some(l),
            Some(Err(e))
                if matches!(
                    e.kind(),
                    std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow
                ) =>
            {
                problem(
                    b,
                    header,
                    format!(
                        "label member .{ext} of sample {:?} holds {}, outside a 64-bit label; \
                         label -1",
                        String::from_utf8_lossy(key),
                        text.unwrap_or_default()
                    ),
                )
            }
            _ => problem(
                b,
                header,
                format!(
                    "label member .{ext} of sample {:?} is not a decimal integer; label -1",
                    String::from_utf8_lossy(key)
                ),
            ),
        }
    }
    if let Some(rank) = opts.payload.iter().position(|p| *p == ext) {
        if c.payload.is_none_or(|(r, _, _)| rank < r) {
            c.payload = Some((rank, data, len));
        }
    }
    Ok(())
}

/// Ends the current sample: a sample with a payload is added, one without is a problem.
fn flush(
    c: Option<Pending>,
    fi: u32,
    opts: &TarOptions,
    b: &mut Builder,
    problem: &dyn Fn(&mut Builder, u64, String),
) -> Result<()> {
    let Some(c) = c else { return Ok(()) };
    let key = String::from_utf8_lossy(&c.key);
    match c.payload {
        Some((_, offset, len)) => {
            let Ok(len) = u32::try_from(len) else {
                problem(
                    b,
                    offset,
                    format!("sample {key:?}: payload of {len} bytes is over 4 GiB; skipped"),
                );
                return Ok(());
            };
            // -1 is "no label": a label below the offset given would become it, or another
            // negative number, without a word.
            let label = match c.label.map(|l| (l, l.checked_sub(opts.label_offset))) {
                None => -1,
                Some((_, Some(v))) if v >= 0 || opts.label_offset == 0 => v,
                Some((l, _)) => {
                    problem(
                        b,
                        c.header,
                        format!(
                            "sample {key:?}: label {l} is below label_offset {}; label -1",
                            opts.label_offset
                        ),
                    );
                    -1
                }
            };
            b.samples.push(Sample {
                file: fi,
                len,
                offset,
                label,
                crc32c: 0,
            });
            b.keys.push(&c.key)?;
        }
        None => problem(
            b,
            c.header,
            format!(
                "sample {key:?} has no member with extension {} (it has .{}); skipped",
                opts.payload.join("|"),
                c.exts.join(" .")
            ),
        ),
    }
    Ok(())
}

/// The next offset at or after `from` (a multiple of 512) holding a valid, non-empty header.
fn resync(w: &mut Window, from: u64) -> Result<Option<u64>> {
    let mut pos = from.div_ceil(BLOCK) * BLOCK;
    while pos + BLOCK <= w.size {
        let n = ((w.size - pos) / BLOCK).min(128) as usize * BLOCK as usize;
        let chunk = w.get(pos, n)?;
        for (k, h) in chunk.chunks_exact(BLOCK as usize).enumerate() {
            let h: &[u8; 512] = h.try_into().expect("a block");
            if h.iter().any(|&x| x != 0)
                && checksum_ok(h)
                && number(&h[124..136]).is_some()
                && &h[257..262] == b"ustar"
            {
                return Ok(Some(pos + k as u64 * BLOCK));
            }
        }
        pos += n as u64;
    }
    Ok(None)
}

/// Whether the header's checksum matches (as an unsigned or, as old tars wrote it, signed sum).
fn checksum_ok(h: &[u8; 512]) -> bool {
    let Some(stored) = number(&h[148..156]) else {
        return false;
    };
    let (mut u, mut s) = (0u64, 0i64);
    for (i, &c) in h.iter().enumerate() {
        let c = if (148..156).contains(&i) { b' ' } else { c };
        u += c as u64;
        s += c as i8 as i64;
    }
    stored == u || stored as i64 == s
}

/// A numeric header field: octal text (space or NUL terminated) or GNU base-256.
fn number(f: &[u8]) -> Option<u64> {
    if f[0] & 0x80 != 0 {
        if f[0] != 0x80 {
            return None; // negative, or not a size
        }
        let mut v = 0u64;
        for &c in &f[1..] {
            v = v.checked_mul(256)?.checked_add(c as u64)?;
        }
        return Some(v);
    }
    let mut v = 0u64;
    let mut digits = f.iter().skip_while(|&&c| c == b' ');
    for &c in digits.by_ref() {
        match c {
            b'0'..=b'7' => v = v.checked_mul(8)?.checked_add((c - b'0') as u64)?,
            0 | b' ' => break,
            _ => return None,
        }
    }
    Some(v)
}

/// The name in a header: `prefix/name` for POSIX ustar, `name` otherwise.
fn header_name(h: &[u8; 512]) -> Vec<u8> {
    let cstr = |f: &[u8]| -> Vec<u8> { f.split(|&c| c == 0).next().unwrap_or(&[]).to_vec() };
    let name = cstr(&h[0..100]);
    if &h[257..263] == b"ustar\0" {
        let prefix = cstr(&h[345..500]);
        if !prefix.is_empty() {
            let mut full = prefix;
            full.push(b'/');
            full.extend_from_slice(&name);
            return full;
        }
    }
    name
}

/// What a pax extended header says about the next member.
#[derive(Debug, Default)]
struct Pax {
    path: Option<Vec<u8>>,
    size: Option<u64>,
    sparse: bool,
}

/// Parses pax records, `LEN key=value\n`, where LEN counts the whole record.
fn parse_pax(mut d: &[u8]) -> std::result::Result<Pax, String> {
    let mut pax = Pax::default();
    while !d.is_empty() {
        if d.iter().all(|&c| c == 0) {
            break; // padding
        }
        let sp = d
            .iter()
            .position(|&c| c == b' ')
            .ok_or("record without a length")?;
        let len: usize = std::str::from_utf8(&d[..sp])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or("bad record length")?;
        if len <= sp + 1 || len > d.len() || d[len - 1] != b'\n' {
            return Err(format!("record length {len} does not fit"));
        }
        let rec = &d[sp + 1..len - 1];
        let eq = rec
            .iter()
            .position(|&c| c == b'=')
            .ok_or("record without '='")?;
        let (k, v) = (&rec[..eq], &rec[eq + 1..]);
        match k {
            b"path" => pax.path = Some(v.to_vec()),
            b"size" => {
                pax.size = Some(
                    std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or("bad size")?,
                )
            }
            _ if k.starts_with(b"GNU.sparse.") => pax.sparse = true,
            _ => {}
        }
        d = &d[len..];
    }
    Ok(pax)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_kept_index_reads_back_as_the_walk_and_a_damaged_one_is_refused() {
        let walk = super::TarWalk {
            size: 10240,
            members: vec![
                super::WalkMember {
                    name: "dir with space/été 1.jpg".into(),
                    header: 0,
                    data: 512,
                    len: 4000,
                    small: None,
                },
                super::WalkMember {
                    name: b"dir with space/\xc3%1.cls".to_vec(),
                    header: 4608,
                    data: 5120,
                    len: 2,
                    small: Some(b"7\n".to_vec()),
                },
                super::WalkMember {
                    name: b"e.txt".to_vec(),
                    header: 5632,
                    data: 6144,
                    len: 0,
                    small: Some(Vec::new()),
                },
            ],
            problems: vec![(6656, "corrupt tar header\nafter x".into())],
            notes: vec!["ends early".into()],
        };
        let text = walk.to_text("\"abc 1\"");
        let back = super::TarWalk::from_text(text.as_bytes(), 10240, "\"abc 1\"").unwrap();
        assert_eq!(back, walk);
        // Another version, a cut, a lie about a member's place, and damage are refused.
        assert!(super::TarWalk::from_text(text.as_bytes(), 10240, "other").is_err());
        assert!(super::TarWalk::from_text(text.as_bytes(), 9999, "\"abc 1\"").is_err());
        let cut = &text[..text.len() - 7];
        assert!(super::TarWalk::from_text(cut.as_bytes(), 10240, "\"abc 1\"").is_err());
        let lie = text.replace("m 0 512 4000", "m 0 512 99999");
        assert!(super::TarWalk::from_text(lie.as_bytes(), 10240, "\"abc 1\"").is_err());
        let bad = text.replace(" x370a", " x37");
        assert!(super::TarWalk::from_text(bad.as_bytes(), 10240, "\"abc 1\"").is_err());
        // A flipped digit that every other check lets through (a shorter length, another
        // name) is caught by the checksum, and every single flipped byte anywhere is.
        for lie in [
            text.replace("m 0 512 4000", "m 0 512 3000"),
            text.replace("%C3%251.cls", "%C3%252.cls"),
        ] {
            assert_ne!(lie, text);
            let e = super::TarWalk::from_text(lie.as_bytes(), 10240, "\"abc 1\"").unwrap_err();
            assert!(e.contains("checksum"), "{e}");
        }
        for i in 0..text.len() {
            let mut b = text.clone().into_bytes();
            b[i] ^= 0x01;
            assert!(
                super::TarWalk::from_text(&b, 10240, "\"abc 1\"").is_err(),
                "a flip at byte {i} was accepted"
            );
        }
        let old = text.replacen("gpufeed-tar-index 2", "gpufeed-tar-index 1", 1);
        let e = super::TarWalk::from_text(old.as_bytes(), 10240, "\"abc 1\"").unwrap_err();
        assert!(e.contains("another version"), "{e}");
    }

    use super::*;

    #[test]
    fn numbers_octal_and_base256() {
        assert_eq!(number(b"00000001750\0"), Some(0o1750));
        assert_eq!(number(b"     17 \0\0\0\0"), Some(0o17));
        assert_eq!(number(b"\0\0\0\0\0\0\0\0\0\0\0\0"), Some(0));
        assert_eq!(number(b"0000000175x\0"), None);
        let mut big = [0u8; 12];
        big[0] = 0x80;
        big[7] = 2; // 2 << 32
        assert_eq!(number(&big), Some(2 << 32));
        big[0] = 0xff;
        assert_eq!(number(&big), None);
        // More than 64 bits of base-256 overflows instead of wrapping.
        let over = [0x80, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(number(&over), None);
    }

    #[test]
    fn pax_records() {
        let p = parse_pax(b"20 path=d/\xc3\xa9t\xc3\xa9.jpg\n11 size=99\n").unwrap();
        assert_eq!(p.path.as_deref(), Some("d/été.jpg".as_bytes()));
        assert_eq!(p.size, Some(99));
        assert!(parse_pax(b"99 path=x\n").is_err());
        assert!(parse_pax(b"10 pathx\n").is_err());
        assert!(parse_pax(b"abc path=x\n").is_err());
    }
}
