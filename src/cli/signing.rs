//! `idem signing`: making signing keys, and the key file participants hold.

use std::io::Read;
use std::path::PathBuf;

use clap::Subcommand;

use super::BoxError;
use idem_signing::{Key, Keyring};

#[derive(Debug, Subcommand)]
pub enum SigningCommand {
    /// Make a key and print its entry for the coordinator's key file
    /// (`--signing-secret-file`): an HMAC-SHA256 secret of 256 random bits, or with
    /// `--ed25519` a private key, its public entry as a comment above it. Keep it private.
    Keygen {
        /// An Ed25519 key pair: participants then hold only the public key.
        #[arg(long)]
        ed25519: bool,
        /// The key id (1 to 64 of A-Z a-z 0-9 . _ -); default: today's date and 4 random
        /// hex digits.
        #[arg(long)]
        kid: Option<String>,
    },
    /// Print the key file participants hold to verify a coordinator's key file: the same
    /// sections, Ed25519 keys as public keys (HMAC secrets as they are, since checking an
    /// HMAC needs the secret).
    Public {
        /// The coordinator's key file; `-` or none: standard input.
        file: Option<PathBuf>,
    },
}

pub fn run(command: SigningCommand) -> Result<(), BoxError> {
    match command {
        SigningCommand::Keygen { ed25519, kid } => {
            let kid = kid.unwrap_or_else(default_kid);
            if ed25519 {
                let key = Key::generate_ed25519(&kid)?;
                println!("# public (for participants): {}", key.verifying_entry());
                println!("{}", key.entry());
            } else {
                println!("{}", Key::generate_hmac(&kid)?.entry());
            }
        }
        SigningCommand::Public { file } => {
            let keyring = match file.filter(|f| f.as_os_str() != "-") {
                Some(path) => Keyring::from_file(&path)?,
                None => {
                    let mut text = String::new();
                    std::io::stdin().read_to_string(&mut text)?;
                    Keyring::parse(&text)?
                }
            };
            print!("{}", keyring.verifying_text());
        }
    }
    Ok(())
}

/// `2026-06-01-3f1c`: sorts by date, and two keys made the same day differ.
fn default_kid() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let date = &crate::timestamp::rfc3339(now)[..10];
    let suffix = &idem_signing::new_call_id()[..4];
    format!("{date}-{suffix}")
}
