//! Key lists per tenant, and a keyring that can be replaced while calls are signed or
//! verified with it (a reload without a restart).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use crate::keys::{KeyError, Keys, push_entries, read};

/// The longest tenant name (the coordinator's rule: 1 to 32 of `a-z 0-9 _ -`).
pub const MAX_TENANT_LEN: usize = 32;

/// Whether `name` is a tenant name as the coordinator allows them: 1 to
/// [`MAX_TENANT_LEN`] characters of `a-z 0-9 _ -`.
pub fn is_tenant_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TENANT_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-'))
}

/// A default key list and key lists per tenant. A tenant's calls are signed, and
/// verified, with its own list when there is one, else with the default list.
///
/// The text form extends a plain key list with sections: entries before any section, or
/// under `[default]`, form the default list; entries under `[tenant NAME]` are that
/// tenant's. A key id appears once in the whole text.
///
/// ```
/// let ring = idem_signing::Keyring::parse(
///     "shared-1:a-secret-of-the-default-list\n[tenant acme]\nacme-1:acme-has-its-own-secret",
/// ).unwrap();
/// assert_eq!(ring.for_tenant("acme").unwrap().signing_key().kid(), "acme-1");
/// assert_eq!(ring.for_tenant("beta").unwrap().signing_key().kid(), "shared-1");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keyring {
    default: Option<Keys>,
    tenants: BTreeMap<String, Keys>,
}

impl From<Keys> for Keyring {
    /// One list for every tenant.
    fn from(keys: Keys) -> Keyring {
        Keyring {
            default: Some(keys),
            tenants: BTreeMap::new(),
        }
    }
}

/// Which list a line of the text adds to.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Section {
    Default,
    Tenant(String),
}

impl Section {
    fn parse(line: &str, n: usize) -> Result<Section, KeyError> {
        let inner = line
            .strip_prefix('[')
            .and_then(|l| l.strip_suffix(']'))
            .ok_or(KeyError::BadSection(n))?
            .trim();
        if inner == "default" {
            return Ok(Section::Default);
        }
        match inner.split_once(char::is_whitespace) {
            Some(("tenant", name)) if is_tenant_name(name.trim()) => {
                Ok(Section::Tenant(name.trim().to_owned()))
            }
            _ => Err(KeyError::BadSection(n)),
        }
    }

    fn name(&self) -> String {
        match self {
            Section::Default => "[default]".into(),
            Section::Tenant(t) => format!("[tenant {t}]"),
        }
    }
}

impl Keyring {
    /// Parses a key file's text: entries as in [`Keys::parse`], with `[default]` and
    /// `[tenant NAME]` lines starting sections (see [`Keyring`]). At least one key; no
    /// empty or repeated section; no key id twice.
    pub fn parse(text: &str) -> Result<Keyring, KeyError> {
        let mut lists: BTreeMap<Section, Vec<crate::Key>> = BTreeMap::new();
        let mut seen: Vec<String> = Vec::new();
        let mut section = Section::Default;
        let mut sections_started = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let trimmed = line.trim();
            if trimmed.starts_with('[') {
                section = Section::parse(trimmed, n + 1)?;
                if sections_started.contains(&section) {
                    return Err(KeyError::DuplicateSection(section.name()));
                }
                sections_started.push(section.clone());
                lists.entry(section.clone()).or_default();
                continue;
            }
            let list = lists.entry(section.clone()).or_default();
            let before = list.len();
            push_entries(list, line, n + 1)?;
            for key in &list[before..] {
                if seen.iter().any(|k| k == key.kid()) {
                    return Err(KeyError::Duplicate(key.kid().to_owned()));
                }
                seen.push(key.kid().to_owned());
            }
        }
        let mut ring = Keyring {
            default: None,
            tenants: BTreeMap::new(),
        };
        for (section, keys) in lists {
            if keys.is_empty() {
                // Blank or comment lines before the first section are no section.
                if section == Section::Default && !sections_started.contains(&section) {
                    continue;
                }
                return Err(KeyError::EmptySection(section.name()));
            }
            let keys = Keys::new(keys)?;
            match section {
                Section::Default => ring.default = Some(keys),
                Section::Tenant(name) => {
                    ring.tenants.insert(name, keys);
                }
            }
        }
        if ring.default.is_none() && ring.tenants.is_empty() {
            return Err(KeyError::Empty);
        }
        Ok(ring)
    }

    /// Reads and parses a key file (see [`Keyring::parse`]).
    pub fn from_file(path: &Path) -> Result<Keyring, KeyError> {
        Keyring::parse(&read(path)?)
    }

    /// The keys of `tenant`'s calls: its own list, else the default list; `None` when
    /// neither exists.
    pub fn for_tenant(&self, tenant: &str) -> Option<&Keys> {
        self.tenants.get(tenant).or(self.default.as_ref())
    }

    /// The default list.
    pub fn default_keys(&self) -> Option<&Keys> {
        self.default.as_ref()
    }

    /// The tenants with a list of their own, and their lists.
    pub fn tenants(&self) -> impl Iterator<Item = (&str, &Keys)> {
        self.tenants.iter().map(|(t, k)| (t.as_str(), k))
    }

    /// Refuses a keyring that cannot sign: a list whose first key is a public key.
    pub fn check_can_sign(&self) -> Result<(), KeyError> {
        let lists = self.default.iter().chain(self.tenants.values());
        for keys in lists {
            let first = keys.signing_key();
            if !first.can_sign() {
                return Err(KeyError::PublicOnly(first.kid().to_owned()));
            }
        }
        Ok(())
    }

    /// The keyring a participant holds to verify this one's signatures, as text: the same
    /// sections, each key's [`verifying_entry`](crate::Key::verifying_entry) (Ed25519
    /// public keys; HMAC secrets as they are, since verifying them needs the secret).
    pub fn verifying_text(&self) -> String {
        let mut out = String::new();
        let mut list = |header: Option<String>, keys: &Keys| {
            if let Some(header) = header {
                out.push_str(&header);
                out.push('\n');
            }
            for key in keys.iter() {
                out.push_str(&key.verifying_entry());
                out.push('\n');
            }
        };
        if let Some(keys) = &self.default {
            list(None, keys);
        }
        for (tenant, keys) in &self.tenants {
            list(Some(format!("[tenant {tenant}]")), keys);
        }
        out
    }
}

/// A keyring shared by everything that signs or verifies, replaced as a whole by a
/// reload: a call uses the keyring that was current when it started. Cheap to clone.
#[derive(Clone, Debug)]
pub struct SharedKeyring(Arc<RwLock<Arc<Keyring>>>);

impl SharedKeyring {
    /// Shares `keyring`.
    pub fn new(keyring: Keyring) -> SharedKeyring {
        SharedKeyring(Arc::new(RwLock::new(Arc::new(keyring))))
    }

    /// The keyring now.
    pub fn current(&self) -> Arc<Keyring> {
        // A poisoned lock still holds a whole keyring: a writer only swaps an Arc.
        Arc::clone(&self.0.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Puts `keyring` in place for every call from now on; whether it differs from the
    /// one it replaces.
    pub fn replace(&self, keyring: Keyring) -> bool {
        let mut current = self.0.write().unwrap_or_else(|e| e.into_inner());
        if **current == keyring {
            return false;
        }
        *current = Arc::new(keyring);
        true
    }

    /// Rereads `path` and puts what it holds in place (see [`SharedKeyring::replace`]); a
    /// file that cannot be read or parsed leaves the current keyring and is the error.
    pub fn reload(&self, path: &Path) -> Result<bool, KeyError> {
        Ok(self.replace(Keyring::from_file(path)?))
    }
}
