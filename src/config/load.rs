//! Loading: reading a file or a directory of documents, the duplicate-domain check (or,
//! with [`LoadOptions::merge_domains`], merging a domain's documents), the content hash,
//! and assembling the validated documents into a [`Config`].
//!
//! This is the only module that touches the file system; it must not interpret the YAML
//! itself (that is `model` and `validate`).

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use super::error::{ConfigError, ConfigErrorKind, ConfigErrors};
use super::model::{self, DescriptorModel, DomainPart};
use super::stats_key::child_key;
use super::{matcher, validate, Config, Domain, FailureMode, LoadOptions};

fn io_error(file: &str, message: impl fmt::Display) -> ConfigErrors {
    ConfigErrors::from_vec(vec![ConfigError {
        file: file.into(),
        line: 0,
        column: 0,
        kind: ConfigErrorKind::Io(message.to_string()),
    }])
}

pub(crate) fn load_path(path: &Path, options: &LoadOptions) -> Result<Config, ConfigErrors> {
    from_documents(&read_documents(path)?, options)
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
            Err(e) => errors.extend(io_error(&name, e).into_vec()),
        }
    }
    if !errors.is_empty() {
        return Err(ConfigErrors::from_vec(errors));
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

pub(crate) fn from_documents(
    docs: &[(String, String)],
    options: &LoadOptions,
) -> Result<Config, ConfigErrors> {
    let mut errors = Vec::new();
    let mut models = Vec::with_capacity(docs.len());
    let mut shared = validate::SharedBuckets::default();
    for (name, text) in docs {
        let file: Arc<str> = name.as_str().into();
        match model::parse(text) {
            Err(e) => errors.push(ConfigError::new(
                &file,
                e.pos,
                ConfigErrorKind::Syntax(e.message),
            )),
            Ok(root) => {
                let (doc, mut doc_errors) = validate::document(&file, &root, &mut shared);
                doc_errors.sort_by_key(|e| (e.line, e.column));
                errors.extend(doc_errors);
                if let Some(doc) = doc {
                    models.push((file, doc));
                }
            }
        }
    }

    // Each domain's first document, and all of its documents in file order.
    let mut by_domain: Vec<(DomainPart, Vec<DomainPart>)> = Vec::new();
    for (file, doc) in &models {
        let part = DomainPart { file, doc };
        match by_domain
            .iter_mut()
            .find(|(first, _)| first.doc.domain == doc.domain)
        {
            None => by_domain.push((part, vec![part])),
            Some((_, parts)) if options.merge_domains => {
                errors.extend(merge_conflicts(parts, part));
                parts.push(part);
            }
            Some((first, _)) => {
                errors.push(ConfigError::new(
                    file,
                    doc.pos,
                    ConfigErrorKind::DuplicateDomain {
                        domain: doc.domain.clone(),
                        other: format!("{}:{}", first.file, first.doc.pos.line),
                    },
                ));
            }
        }
    }
    if !errors.is_empty() {
        return Err(ConfigErrors::from_vec(errors));
    }

    let mut rule_count = 0;
    let domains = by_domain
        .into_iter()
        .map(|(first, parts)| {
            let name = first.doc.domain.clone();
            let domain = domain_of(&name, &parts, &mut rule_count);
            (name, domain)
        })
        .collect();
    Ok(Config {
        domains,
        rule_count,
        hash: content_hash(docs),
    })
}

/// The domain `name` of its validated `parts` (one document, or several merged), its
/// rules numbered from `*rule_count` on.
fn domain_of(name: &str, parts: &[DomainPart], rule_count: &mut usize) -> Domain {
    let domain_name: Arc<str> = name.into();
    Domain {
        failure_mode: parts
            .iter()
            .find_map(|p| p.doc.failure_mode)
            .unwrap_or(FailureMode::Deny),
        rlqs_keys: parts
            .iter()
            .find_map(|p| p.doc.rlqs_keys.as_deref())
            .map(Arc::from),
        tree: matcher::Tree::compile(&domain_name, parts, rule_count),
        name: domain_name,
    }
}

/// What stops `doc` (in `file`) from merging into the domain's earlier `parts`: a
/// top-level descriptor with a composite key another part has (upstream's "duplicate
/// descriptor composite key"), or a different top-level `failure_mode`.
fn merge_conflicts(parts: &[DomainPart], part: DomainPart) -> Vec<ConfigError> {
    let DomainPart { file, doc } = part;
    let mut errors = Vec::new();
    for d in &doc.descriptors {
        let same = |o: &&DescriptorModel| o.key == d.key && o.value == d.value;
        if let Some((other, o)) = parts
            .iter()
            .find_map(|p| p.doc.descriptors.iter().find(same).map(|o| (p.file, o)))
        {
            errors.push(ConfigError::new(
                file,
                d.pos,
                ConfigErrorKind::DuplicateAcrossFiles {
                    key: child_key(&doc.domain, &d.key, d.value.as_deref()),
                    other: format!("{other}:{}", o.pos.line),
                },
            ));
        }
    }
    let differs = |p: &&DomainPart| {
        let (a, b) = (p.doc.failure_mode, doc.failure_mode);
        a.is_some() && b.is_some() && a != b
    };
    if let Some(other) = parts.iter().find(differs) {
        errors.push(ConfigError::new(
            file,
            doc.pos,
            ConfigErrorKind::MergedFailureModeDiffers {
                other: other.file.to_string(),
            },
        ));
    }
    let differs = |p: &&DomainPart| {
        let (a, b) = (&p.doc.rlqs_keys, &doc.rlqs_keys);
        a.is_some() && b.is_some() && a != b
    };
    if let Some(other) = parts.iter().find(differs) {
        errors.push(ConfigError::new(
            file,
            doc.pos,
            ConfigErrorKind::MergedRlqsDiffers {
                other: other.file.to_string(),
            },
        ));
    }
    errors
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
    use crate::config::model::Pos;

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
