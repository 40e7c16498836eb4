//! The one public error type.
//!
//! Every failure gpufeed reports is an [`Error`]: a [`ErrorKind`] plus whatever context is known
//! — the file, the byte offset and length of the request, the sample — and the error that caused
//! it (an OS error, a CUDA error, another gpufeed error) as its
//! [`source`](std::error::Error::source), kept whole so a caller can walk or downcast the chain.
//! `Display` is short and lower-case, in the style of std, names the context so that a log line
//! alone says which file and which bytes were at fault, and does not repeat the source (as std
//! asks of errors with a source); [`Error::report`] writes the whole chain for a log or a user.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What kind of failure an [`Error`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A file named by the caller does not exist.
    NotFound,
    /// The caller may not open or read a file.
    PermissionDenied,
    /// A file ended before the bytes that were asked for: it shrank while being read, or an
    /// index claims more than the file holds.
    UnexpectedEof,
    /// The operating system reported an I/O error for a read.
    Io,
    /// A configuration value or a request is outside its limits (the message says which).
    InvalidInput,
    /// The kernel or the platform lacks something gpufeed needs and no fallback applies.
    Unsupported,
    /// No free slot, operation or file entry is left; wait for completions and try again.
    Busy,
    /// The read was cancelled before it completed (the engine was shut down).
    Cancelled,
    /// The caller asked for a time limit (a loader's `timeout`) and it passed.
    TimedOut,
}

impl ErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "file not found",
            ErrorKind::PermissionDenied => "permission denied",
            ErrorKind::UnexpectedEof => "file ended early",
            ErrorKind::Io => "i/o error",
            ErrorKind::InvalidInput => "invalid input",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Busy => "busy",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::TimedOut => "timed out",
        }
    }
}

/// gpufeed's error: a kind, a message, and the file/offset/length/sample it concerns.
pub struct Error(Box<Inner>);

struct Inner {
    kind: ErrorKind,
    message: String,
    path: Option<Arc<Path>>,
    /// How `path` is named to people where the file stands for something else (a remote
    /// object's node-cache copy: its URL).
    shown_as: Option<Arc<str>>,
    offset: Option<u64>,
    len: Option<u64>,
    sample: Option<u64>,
    /// Shared, so that cloning an error keeps its cause exactly.
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

/// `Result<T, gpufeed::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind` with a short lower-case message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error(Box::new(Inner {
            kind,
            message: message.into(),
            path: None,
            shown_as: None,
            offset: None,
            len: None,
            sample: None,
            source: None,
        }))
    }

    /// An error for an `io::Error`, its kind mapped from the OS error.
    pub fn io(message: impl Into<String>, source: io::Error) -> Error {
        let kind = match source.kind() {
            io::ErrorKind::NotFound => ErrorKind::NotFound,
            io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            io::ErrorKind::UnexpectedEof => ErrorKind::UnexpectedEof,
            io::ErrorKind::InvalidInput => ErrorKind::InvalidInput,
            io::ErrorKind::Unsupported => ErrorKind::Unsupported,
            _ => match source.raw_os_error() {
                Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) => ErrorKind::Unsupported,
                Some(libc::ECANCELED) => ErrorKind::Cancelled,
                _ => ErrorKind::Io,
            },
        };
        Error::new(kind, message).with_source(source)
    }

    /// Attaches the error that caused this one (kept whole: [`source`] returns it).
    ///
    /// [`source`]: std::error::Error::source
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Error {
        self.0.source = Some(Arc::new(source));
        self
    }

    /// Attaches a cause already shared (one failed read that several samples report).
    pub fn with_shared_source(mut self, source: Arc<Error>) -> Error {
        self.0.source = Some(source);
        self
    }

    /// An error for a negative errno as io_uring and the backends report it.
    pub(crate) fn errno(message: impl Into<String>, errno: i32) -> Error {
        Error::io(message, io::Error::from_raw_os_error(errno))
    }

    /// Attaches the file this error concerns.
    pub fn with_path(mut self, path: impl Into<Arc<Path>>) -> Error {
        self.0.path = Some(path.into());
        self.0.shown_as = None;
        self
    }

    /// Names the error's file `name` in its text (a remote object's URL for its node-cache
    /// copy); [`path`](Self::path) stays the file.
    #[cfg_attr(
        not(feature = "remote"),
        allow(
            dead_code,
            reason = "only remote datasets' files stand for something else"
        )
    )]
    pub(crate) fn shown_as(mut self, name: impl Into<Arc<str>>) -> Error {
        self.0.shown_as = Some(name.into());
        self
    }

    /// Attaches the byte range (offset, length) of the request this error concerns.
    pub fn with_range(mut self, offset: u64, len: u64) -> Error {
        self.0.offset = Some(offset);
        self.0.len = Some(len);
        self
    }

    /// Attaches the byte offset this error concerns.
    pub fn with_offset(mut self, offset: u64) -> Error {
        self.0.offset = Some(offset);
        self
    }

    /// Attaches the sample (its index in the dataset) this error concerns.
    pub fn with_sample(mut self, sample: u64) -> Error {
        self.0.sample = Some(sample);
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    /// The file concerned, if known.
    pub fn path(&self) -> Option<&Path> {
        self.0.path.as_deref()
    }

    /// The file concerned as the error's text names it: a remote object's URL rather than the
    /// node cache's copy of it.
    pub fn shown_path(&self) -> Option<String> {
        let p = self.0.path.as_deref()?;
        Some(match &self.0.shown_as {
            Some(name) => redact(name).into_owned(),
            None => shown(p),
        })
    }

    /// The byte offset concerned, if known.
    pub fn offset(&self) -> Option<u64> {
        self.0.offset
    }

    /// The length in bytes of the request concerned, if known.
    pub fn request_len(&self) -> Option<u64> {
        self.0.len
    }

    /// The sample concerned, if known.
    pub fn sample(&self) -> Option<u64> {
        self.0.sample
    }

    /// The OS error number, if this error (or one in its chain) came from the OS.
    pub fn raw_os_error(&self) -> Option<i32> {
        let s = self.0.source.as_deref()?;
        if let Some(io) = s.downcast_ref::<io::Error>() {
            return io.raw_os_error();
        }
        s.downcast_ref::<Error>().and_then(Error::raw_os_error)
    }

    /// The whole chain as one line: this error (with its context), then each cause after a
    /// colon — what a log or a user should see.
    pub fn report(&self) -> String {
        let mut out = self.to_string();
        let mut next = std::error::Error::source(self);
        while let Some(e) = next {
            out.push_str(": ");
            // A cause from another crate (an HTTP client's error) may quote a URL whole.
            out.push_str(&redact(&e.to_string()));
            next = e.source();
        }
        out
    }

    /// The message without context.
    pub fn message(&self) -> &str {
        &self.0.message
    }
}

impl Clone for Error {
    /// The same kind, message, context and cause (shared).
    fn clone(&self) -> Error {
        let i = &self.0;
        Error(Box::new(Inner {
            kind: i.kind,
            message: i.message.clone(),
            path: i.path.clone(),
            shown_as: i.shown_as.clone(),
            offset: i.offset,
            len: i.len,
            sample: i.sample,
            source: i.source.clone(),
        }))
    }
}

/// A path as an error's one line shows it: a byte that is not UTF-8 as `\xNN` (not U+FFFD,
/// which names no file) and a control character escaped (a newline in a name would split the
/// line a script reads).
pub(crate) fn shown(p: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for c in p.as_os_str().as_bytes().utf8_chunks() {
        for ch in c.valid().chars() {
            if ch.is_control() {
                out.extend(ch.escape_default());
            } else {
                out.push(ch);
            }
        }
        for b in c.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &*self.0;
        if i.message.is_empty() {
            f.write_str(i.kind.as_str())?;
        } else {
            f.write_str(&redact(&i.message))?;
        }
        if let Some(p) = self.shown_path() {
            write!(f, ": {p}")?;
        }
        if let Some(s) = i.sample {
            write!(f, ", sample {s}")?;
        }
        match (i.offset, i.len) {
            (Some(o), Some(l)) => write!(f, ", offset {o}, length {l}")?,
            (Some(o), None) => write!(f, ", offset {o}")?,
            _ => {}
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &*self.0;
        let mut d = f.debug_struct("Error");
        d.field("kind", &i.kind)
            .field("message", &redact(&i.message));
        if let Some(p) = &i.path {
            d.field("path", p);
        }
        if let Some(o) = i.offset {
            d.field("offset", &o);
        }
        if let Some(l) = i.len {
            d.field("len", &l);
        }
        if let Some(s) = i.sample {
            d.field("sample", &s);
        }
        if let Some(s) = &i.source {
            // The cause's own debug form, its secrets redacted.
            struct Redacted(String);
            impl fmt::Debug for Redacted {
                fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str(&self.0)
                }
            }
            d.field("source", &Redacted(redact(&format!("{s:?}")).into_owned()));
        }
        d.finish()
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0
            .source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match e.kind() {
            ErrorKind::NotFound => io::ErrorKind::NotFound,
            ErrorKind::PermissionDenied => io::ErrorKind::PermissionDenied,
            ErrorKind::UnexpectedEof => io::ErrorKind::UnexpectedEof,
            ErrorKind::InvalidInput => io::ErrorKind::InvalidInput,
            ErrorKind::Unsupported => io::ErrorKind::Unsupported,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// Query parameters whose values are credentials (lower case): S3 presigned URLs, Azure SAS,
/// GCS signed URLs, and the usual names.
const SECRET_PARAMS: &[&str] = &[
    "x-amz-signature",
    "x-amz-credential",
    "x-amz-security-token",
    "x-goog-signature",
    "x-goog-credential",
    "sig",
    "signature",
    "token",
    "access_token",
    "password",
    "secret",
    "awsaccesskeyid",
];

/// `text` with the secrets a URL may carry replaced by `***`: the userinfo of every
/// `scheme://user:password@host` (`scheme://***@host`) and the values of credential query
/// parameters (`X-Amz-Signature=***`, `sig=***`, …). Every error's text goes through it
/// (display, [`Error::report`], debug), and so do the URLs the front doors print.
pub fn redact(text: &str) -> std::borrow::Cow<'_, str> {
    let ends = |c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ')' | '>' | ',' | ';');
    if !text.contains("://") {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        out.push_str(&rest[..at + 3]);
        rest = &rest[at + 3..];
        // The authority, up to the path, query, fragment or the end of the URL in the text.
        let auth_end = rest
            .find(|c: char| ends(c) || matches!(c, '/' | '?' | '#'))
            .unwrap_or(rest.len());
        let (auth, after) = rest.split_at(auth_end);
        match auth.rfind('@') {
            Some(k) => {
                out.push_str("***");
                out.push_str(&auth[k..]);
            }
            None => out.push_str(auth),
        }
        // The rest of this URL: its query's credential values.
        let url_end = after.find(ends).unwrap_or(after.len());
        let (url, tail) = after.split_at(url_end);
        match url.find('?') {
            Some(q) => {
                out.push_str(&url[..=q]);
                let params: Vec<String> = url[q + 1..]
                    .split('&')
                    .map(|p| match p.split_once('=') {
                        // The value ends at a `:` too (a signature or token has none), so that
                        // "URL?sig=SECRET: what went wrong" keeps its separator.
                        Some((k, v))
                            if SECRET_PARAMS.contains(&k.to_ascii_lowercase().as_str()) =>
                        {
                            format!("{k}=***{}", v.find(':').map_or("", |i| &v[i..]))
                        }
                        _ => p.to_string(),
                    })
                    .collect();
                out.push_str(&params.join("&"));
            }
            None => out.push_str(url),
        }
        rest = tail;
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

/// Shorthand for an [`ErrorKind::InvalidInput`] error.
pub(crate) fn invalid(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidInput, message)
}

/// A path as shared context for errors, cheap to clone.
pub(crate) fn shared_path(p: &Path) -> Arc<Path> {
    Arc::from(PathBuf::from(p).into_boxed_path())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name that is not UTF-8, or holds a newline, is shown so that it names its file and
    /// keeps the error on one line.
    #[test]
    fn odd_names_are_shown_on_one_line() {
        use std::os::unix::ffi::OsStrExt;
        let p = Path::new(std::ffi::OsStr::from_bytes(b"/d/caf\xc3\xa9 \xff:%\nx.jpg"));
        let e = Error::errno("read failed", libc::EIO).with_path(shared_path(p));
        let s = e.to_string();
        assert_eq!(s, "read failed: /d/caf\u{e9} \\xff:%\\nx.jpg");
        assert_eq!(e.report().lines().count(), 1);
    }

    #[test]
    fn display_names_file_offset_and_cause() {
        let e = Error::errno("read failed", libc::EIO)
            .with_path(shared_path(Path::new("/data/shard-0001.gpf")))
            .with_range(4096, 512)
            .with_sample(7);
        let s = e.to_string();
        assert_eq!(
            s,
            "read failed: /data/shard-0001.gpf, sample 7, offset 4096, length 512"
        );
        let r = e.report();
        assert!(
            r.starts_with(&format!("{s}: ")) && r.contains("os error 5"),
            "{r}"
        );
        assert_eq!(e.kind(), ErrorKind::Io);
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert!(std::error::Error::source(&e).is_some());
    }

    /// A chain of gpufeed errors keeps every cause: clones share it, `source` walks it, the OS
    /// code is found through it, and the report names each once.
    #[test]
    fn causes_are_kept_whole_through_clones_and_chains() {
        let read = Arc::new(Error::errno("read failed", libc::EIO).with_offset(8192));
        let sample = Error::new(ErrorKind::Io, "sample unavailable")
            .with_sample(3)
            .with_shared_source(read.clone());
        let copy = sample.clone();
        for e in [&sample, &copy] {
            assert_eq!(e.raw_os_error(), Some(libc::EIO));
            let cause = std::error::Error::source(e).unwrap();
            assert_eq!(cause.downcast_ref::<Error>().unwrap().offset(), Some(8192));
            let r = e.report();
            assert_eq!(r.matches("read failed").count(), 1, "{r}");
            assert!(
                r.starts_with("sample unavailable, sample 3: read failed, offset 8192: "),
                "{r}"
            );
        }
    }

    #[test]
    fn os_errors_map_to_kinds() {
        assert_eq!(Error::errno("x", libc::ENOENT).kind(), ErrorKind::NotFound);
        assert_eq!(
            Error::errno("x", libc::EACCES).kind(),
            ErrorKind::PermissionDenied
        );
        assert_eq!(
            Error::errno("x", libc::ECANCELED).kind(),
            ErrorKind::Cancelled
        );
        assert_eq!(
            Error::errno("x", libc::ENOSYS).kind(),
            ErrorKind::Unsupported
        );
    }

    /// Secrets a URL carries never reach a message: userinfo and credential parameters are
    /// replaced, in the error's own text, its causes' and its debug form; the rest is kept.
    #[test]
    fn urls_lose_their_secrets_in_every_form_of_an_error() {
        let cases = [
            (
                "http://user:PASSWORD@host:8333/bucket/x.tar: GET failed",
                "http://***@host:8333/bucket/x.tar: GET failed",
            ),
            (
                "s3://AKIA:PASSWORD@bucket/p (no such bucket)",
                "s3://***@bucket/p (no such bucket)",
            ),
            (
                "https://h/b/o?X-Amz-Credential=AKIA%2FPASSWORD&X-Amz-Signature=PASSWORD&part=2 x",
                "https://h/b/o?X-Amz-Credential=***&X-Amz-Signature=***&part=2 x",
            ),
            (
                "az://acct/c/o?sv=1&sig=PASSWORD",
                "az://acct/c/o?sv=1&sig=***",
            ),
            (
                "two: http://a:PASSWORD@h/x and http://b@h/y?token=PASSWORD",
                "two: http://***@h/x and http://***@h/y?token=***",
            ),
            (
                "s3://b/p?X-Amz-Signature=PASSWORD: nothing is stored",
                "s3://b/p?X-Amz-Signature=***: nothing is stored",
            ),
            ("no url: a@b and ?sig=1", "no url: a@b and ?sig=1"),
            ("http://host/path@v2/x", "http://host/path@v2/x"),
        ];
        for (text, want) in cases {
            assert_eq!(redact(text), want, "{text}");
            let cause = std::io::Error::other(text.to_string());
            let e = invalid(text).with_source(cause);
            for shown in [e.to_string(), e.report(), format!("{e:?}")] {
                assert!(!shown.contains("PASSWORD"), "{shown}");
            }
        }
    }
}
