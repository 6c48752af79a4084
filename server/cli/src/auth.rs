//! Wiring of authentication: keys from flags and files, and `composer token`.

use std::{path::PathBuf, time::Duration};

use clap::Args;
use composer_grpc::auth::{AuthMode, MintError, NewToken, SigningKey, VerificationKey, mint};

use crate::config::{AuthArgs, parse_duration};

/// Why the auth settings could not be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthSetupError {
    /// No key and no `--insecure`.
    #[error(
        "no token key configured: set COMPOSER_AUTH_SECRET (--auth-secret), COMPOSER_AUTH_PUBLIC_KEY \
         (--auth-public-key) or COMPOSER_AUTH_JWKS (--auth-jwks), or pass --insecure to run without authentication"
    )]
    NoKey,
    /// A key file could not be read.
    #[error("{0}: {1}")]
    Read(PathBuf, std::io::Error),
    /// A key is unusable.
    #[error("{0}")]
    Key(String),
}

fn read(path: &PathBuf) -> Result<String, AuthSetupError> {
    std::fs::read_to_string(path).map_err(|e| AuthSetupError::Read(path.clone(), e))
}

/// The authentication mode the flags ask for.
pub fn auth_mode(args: &AuthArgs) -> Result<AuthMode, AuthSetupError> {
    if args.insecure {
        return Ok(AuthMode::Insecure);
    }
    let mut keys = Vec::new();
    if let Some(secret) = &args.auth_secret {
        keys.push(VerificationKey::hs256(secret.as_bytes()).map_err(|e| {
            AuthSetupError::Key(format!("COMPOSER_AUTH_SECRET (--auth-secret): {e}"))
        })?);
    }
    for path in &args.auth_public_key {
        let pem = read(path)?;
        keys.push(
            VerificationKey::from_pem(&path.display().to_string(), pem.as_bytes())
                .map_err(|e| AuthSetupError::Key(e.to_string()))?,
        );
    }
    if let Some(path) = &args.auth_jwks {
        let json = read(path)?;
        keys.extend(
            VerificationKey::from_jwks(&path.display().to_string(), &json)
                .map_err(|e| AuthSetupError::Key(e.to_string()))?,
        );
    }
    if keys.is_empty() {
        return Err(AuthSetupError::NoKey);
    }
    Ok(AuthMode::Tokens {
        keys,
        issuer: args.auth_issuer.clone(),
        audience: args.auth_audience.clone(),
        leeway_secs: args.auth_leeway.as_secs(),
    })
}

/// Options of `composer token`.
#[derive(Debug, Clone, Args)]
pub struct TokenArgs {
    /// Subject: who the token is for (recorded in run history).
    #[arg(long)]
    pub sub: String,
    /// Namespace.
    #[arg(long, default_value = "default")]
    pub ns: String,
    /// Roles: admin, operator, client, reader, worker (comma-separated).
    #[arg(long, value_delimiter = ',', required = true)]
    pub role: Vec<String>,
    /// For workers: the queues the token may poll (comma-separated; `*`: any).
    #[arg(long, value_delimiter = ',')]
    pub queues: Option<Vec<String>>,
    /// Lifetime, e.g. `1h`, `30m`, `24h`.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub ttl: Duration,
    /// HS256 secret to sign with (the server's COMPOSER_AUTH_SECRET).
    #[arg(long, env = "COMPOSER_AUTH_SECRET", hide_env_values = true)]
    pub auth_secret: Option<String>,
    /// RSA or Ed25519 private key (PEM) to sign with instead.
    #[arg(long, env = "COMPOSER_AUTH_PRIVATE_KEY")]
    pub private_key: Option<PathBuf>,
    /// Sign with the secret of `composer dev` whose data folder this is
    /// (the `data` line `composer dev` prints; it keeps the secret in
    /// `auth-secret` there).
    #[arg(long, conflicts_with_all = ["auth_secret", "private_key"])]
    pub dev_data: Option<PathBuf>,
    /// Key id (`kid`) to put in the header.
    #[arg(long)]
    pub kid: Option<String>,
    /// `iss` claim.
    #[arg(long, env = "COMPOSER_AUTH_ISSUER")]
    pub issuer: Option<String>,
    /// `aud` claim.
    #[arg(long, env = "COMPOSER_AUTH_AUDIENCE")]
    pub audience: Option<String>,
}

/// Why a token could not be minted.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// No key given.
    #[error(
        "no signing key: set COMPOSER_AUTH_SECRET (--auth-secret) or --private-key; for `composer dev`, --dev-data <its data folder>"
    )]
    NoKey,
    /// The dev data folder holds no secret.
    #[error(
        "{0}: no `composer dev` secret here ({1}); pass the data folder `composer dev` printed"
    )]
    NoDevSecret(PathBuf, std::io::Error),
    /// The key file could not be read.
    #[error("{0}: {1}")]
    Read(PathBuf, std::io::Error),
    /// Minting failed.
    #[error(transparent)]
    Mint(#[from] MintError),
}

/// Where `composer dev` keeps its HS256 secret, in its data folder.
pub const DEV_SECRET_FILE: &str = "auth-secret";

/// Mints a token as `args` say.
pub fn mint_token(args: &TokenArgs) -> Result<String, TokenError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let token = NewToken {
        sub: args.sub.clone(),
        ns: args.ns.clone(),
        roles: args.role.clone(),
        queues: args.queues.clone(),
        iat: now,
        nbf: now,
        exp: now + args.ttl.as_secs(),
        iss: args.issuer.clone(),
        aud: args.audience.clone(),
    };
    if let Some(path) = &args.private_key {
        let pem = std::fs::read(path).map_err(|e| TokenError::Read(path.clone(), e))?;
        return Ok(mint(&token, SigningKey::Pem(&pem), args.kid.as_deref())?);
    }
    let secret = match &args.dev_data {
        Some(folder) => {
            let path = folder.join(DEV_SECRET_FILE);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| TokenError::NoDevSecret(path.clone(), e))?;
            text.trim().to_owned()
        }
        None => args.auth_secret.clone().ok_or(TokenError::NoKey)?,
    };
    Ok(mint(
        &token,
        SigningKey::Secret(secret.as_bytes()),
        args.kid.as_deref(),
    )?)
}
