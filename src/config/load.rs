//! Loading: reading a file or a directory of documents, the error types every stage
//! reports with, the duplicate-domain check, the content hash, and assembling the
//! validated documents into a [`Config`].
//!
//! This is the only module that touches the file system; it must not interpret the YAML
//! itself (that is `model` and `validate`).

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use super::entity::TemplateError;
use super::model::{self, Pos};
use super::{matcher, validate, Config, Domain, FailureMode};

/// What is wrong, without the where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    #[error("cannot read: {0}")]
    Io(String),
    #[error("YAML syntax error: {0}")]
    Syntax(String),
    #[error("{what} must be a mapping, found {found}")]
    NotAMapping { what: &'static str, found: String },
    #[error("keys of {context} must be strings, found {found}")]
    NonStringKey {
        context: &'static str,
        found: String,
    },
    #[error("unknown key '{key}' in {context}")]
    UnknownKey { key: String, context: &'static str },
    #[error("missing '{key}' in {context}")]
    MissingKey {
        key: &'static str,
        context: &'static str,
    },
    #[error("'{key}' must not be empty")]
    Empty { key: &'static str },
    #[error("'{key}' must be {expected}, found {found}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
        found: String,
    },
    #[error("'{key}' must be an integer in {min}..={max}, found '{found}'")]
    OutOfRange {
        key: &'static str,
        found: String,
        min: u64,
        max: u64,
    },
    #[error("invalid unit '{0}' (expected second, minute, hour, day, week, month or year)")]
    InvalidUnit(String),
    #[error("invalid failure_mode '{0}' (expected allow or deny)")]
    InvalidFailureMode(String),
    #[error("'unlimited: true' must not be combined with '{0}'")]
    UnlimitedWith(&'static str),
    #[error("rate_limit needs '{0}' unless it is 'unlimited: true'")]
    MissingLimitField(&'static str),
    #[error("'replaces' entry needs a non-empty 'name'")]
    ReplacesWithoutName,
    #[error("'replaces' names this rule's own name '{0}'")]
    ReplacesItself(String),
    #[error("invalid limit name '{name}': {reason}")]
    InvalidLimitName { name: String, reason: &'static str },
    #[error("invalid resource '{resource}': {reason}")]
    InvalidResource {
        resource: String,
        reason: &'static str,
    },
    #[error("'share_threshold: true' needs a value with a '*' wildcard, found {0}")]
    ShareThresholdWithoutWildcard(String),
    #[error("'cascade: true' on a descriptor without a limited rate_limit")]
    CascadeWithoutLimit,
    #[error("'cascade: true' but no ancestor descriptor has a rate_limit")]
    CascadeWithoutParent,
    #[error("'cascade: true' but the nearest ancestor rate_limit (line {0}) is unlimited")]
    CascadeToUnlimited(u32),
    #[error("invalid entity template '{template}': {error}")]
    EntityTemplate {
        template: String,
        error: TemplateError,
    },
    #[error("entity template '{template}' uses '{{{key}}}' but no descriptor on this path has key '{key}'")]
    EntityUnknownKey { template: String, key: String },
    #[error("duplicate descriptor composite key '{key}' (first at line {first_line})")]
    DuplicateCompositeKey { key: String, first_line: u32 },
    #[error("limit '{name}' differs from the one at line {other_line}: both rules use entity template '{template}' and resource '{resource}', so they share one bucket and must agree on unit, requests_per_unit, burst and overdraft")]
    ConflictingLimit {
        name: String,
        template: String,
        resource: String,
        other_line: u32,
    },
    #[error("duplicate domain '{domain}' (also in {other})")]
    DuplicateDomain { domain: String, other: String },
    #[error("'{key}' is {bytes} bytes long, at most {max} (it is part of every store key)")]
    TooLong {
        key: &'static str,
        bytes: usize,
        max: usize,
    },
    #[error("entity template '{template}' and resource '{resource}' would put {count} limits in one bucket item, at most {max}")]
    TooManyLimits {
        template: String,
        resource: String,
        count: usize,
        max: usize,
    },
}

/// One problem, located: `file:line:column: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file name as given to [`Config::load`] or [`Config::from_documents`].
    pub file: Arc<str>,
    /// 1-based; 0 when the problem concerns the whole file (e.g. it cannot be read).
    pub line: u32,
    /// 1-based; 0 when unknown.
    pub column: u32,
    pub kind: ConfigErrorKind,
}

impl ConfigError {
    pub(crate) fn new(file: &Arc<str>, pos: Pos, kind: ConfigErrorKind) -> ConfigError {
        ConfigError {
            file: Arc::clone(file),
            line: pos.line,
            column: pos.column,
            kind,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (0, _) => write!(f, "{}: {}", self.file, self.kind),
            (line, 0) => write!(f, "{}:{line}: {}", self.file, self.kind),
            (line, column) => write!(f, "{}:{line}:{column}: {}", self.file, self.kind),
        }
    }
}

/// Every problem found in a load (never empty); `Display` prints one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(Vec<ConfigError>);

impl ConfigErrors {
    pub fn iter(&self) -> impl Iterator<Item = &ConfigError> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: a `ConfigErrors` holds at least one error.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn into_vec(self) -> Vec<ConfigError> {
        self.0
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

fn io_error(file: &str, message: impl fmt::Display) -> ConfigErrors {
    ConfigErrors(vec![ConfigError {
        file: file.into(),
        line: 0,
        column: 0,
        kind: ConfigErrorKind::Io(message.to_string()),
    }])
}

pub(crate) fn load_path(path: &Path) -> Result<Config, ConfigErrors> {
    from_documents(&read_documents(path)?)
}

/// The `(file name, text)` documents at `path`: the file, or the directory's YAML files.
pub(crate) fn read_documents(path: &Path) -> Result<Vec<(String, String)>, ConfigErrors> {
    let shown = path.display().to_string();
    // `metadata` follows symlinks, as a ConfigMap mount needs.
    let meta = std::fs::metadata(path).map_err(|e| io_error(&shown, e))?;
    let files = if meta.is_dir() {
        document_files(path).map_err(|e| io_error(&shown, e))?
    } else {
        vec![path.to_path_buf()]
    };
    let mut docs = Vec::with_capacity(files.len());
    let mut errors = Vec::new();
    for file in files {
        let name = file.display().to_string();
        match std::fs::read_to_string(&file) {
            Ok(text) => docs.push((name, text)),
            Err(e) => errors.extend(io_error(&name, e).0),
        }
    }
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    Ok(docs)
}

/// The `*.yaml`/`*.yml` regular files of `dir` (after following symlinks), sorted by
/// name. Names starting with `.` are skipped: hidden files and Kubernetes' `..data`
/// and `..<timestamp>` entries, whose files are reached through the top-level links.
fn document_files(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let is_yaml = Path::new(name)
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"));
        if name.starts_with('.') || !is_yaml {
            continue;
        }
        if std::fs::metadata(entry.path())?.is_file() {
            names.push(name.to_string());
        }
    }
    names.sort();
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

pub(crate) fn from_documents(docs: &[(String, String)]) -> Result<Config, ConfigErrors> {
    let mut errors = Vec::new();
    let mut models = Vec::with_capacity(docs.len());
    for (name, text) in docs {
        let file: Arc<str> = name.as_str().into();
        match model::parse(text) {
            Err(e) => errors.push(ConfigError::new(
                &file,
                e.pos,
                ConfigErrorKind::Syntax(e.message),
            )),
            Ok(root) => {
                let (doc, mut doc_errors) = validate::document(&file, &root);
                doc_errors.sort_by_key(|e| (e.line, e.column));
                errors.extend(doc_errors);
                if let Some(doc) = doc {
                    models.push((file, doc));
                }
            }
        }
    }

    let mut seen: HashMap<&str, (&Arc<str>, Pos)> = HashMap::new();
    for (file, doc) in &models {
        if let Some((other, other_pos)) = seen.get(doc.domain.as_str()) {
            errors.push(ConfigError::new(
                file,
                doc.pos,
                ConfigErrorKind::DuplicateDomain {
                    domain: doc.domain.clone(),
                    other: format!("{other}:{}", other_pos.line),
                },
            ));
        } else {
            seen.insert(&doc.domain, (file, doc.pos));
        }
    }
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }

    let mut rule_count = 0;
    let domains = models
        .iter()
        .map(|(file, doc)| {
            let name: Arc<str> = doc.domain.as_str().into();
            let domain = Domain {
                failure_mode: doc.failure_mode.unwrap_or(FailureMode::Deny),
                tree: matcher::Tree::compile(&name, file, doc, &mut rule_count),
                name,
            };
            (doc.domain.clone(), domain)
        })
        .collect();
    Ok(Config {
        domains,
        rule_count,
        hash: content_hash(docs),
    })
}

/// FNV-1a 64 over the documents sorted by file name, each name and text preceded by its
/// length so that moving bytes between them changes the hash. It tells versions apart;
/// it is not a security measure.
pub(crate) fn content_hash(docs: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = docs.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut h = Fnv1a64::new();
    for (name, text) in sorted {
        h.write(&(name.len() as u64).to_le_bytes());
        h.write(name.as_bytes());
        h.write(&(text.len() as u64).to_le_bytes());
        h.write(text.as_bytes());
    }
    format!("{:016x}", h.0)
}

/// The 64-bit FNV-1a hash (a fixed, documented algorithm, unlike std's `DefaultHasher`).
struct Fnv1a64(u64);

impl Fnv1a64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn new() -> Self {
        Fnv1a64(Self::OFFSET_BASIS)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        let hash = |s: &str| {
            let mut h = Fnv1a64::new();
            h.write(s.as_bytes());
            h.0
        };
        assert_eq!(hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(hash("foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(content_hash(&[]), "cbf29ce484222325");
    }

    #[test]
    fn hash_ignores_document_order_but_not_content() {
        let a = ("a.yaml".to_string(), "domain: a\n".to_string());
        let b = ("b.yaml".to_string(), "domain: b\n".to_string());
        let ab = content_hash(&[a.clone(), b.clone()]);
        assert_eq!(ab, content_hash(&[b.clone(), a.clone()]));
        let b2 = ("b.yaml".to_string(), "domain: c\n".to_string());
        assert_ne!(ab, content_hash(&[a, b2]));
    }

    #[test]
    fn error_display_omits_unknown_positions() {
        let file: Arc<str> = "x.yaml".into();
        let e = ConfigError::new(&file, Pos::default(), ConfigErrorKind::Io("gone".into()));
        assert_eq!(e.to_string(), "x.yaml: cannot read: gone");
        let e = ConfigError::new(
            &file,
            Pos { line: 3, column: 0 },
            ConfigErrorKind::Empty { key: "key" },
        );
        assert_eq!(e.to_string(), "x.yaml:3: 'key' must not be empty");
    }
}
