//! `composer secret set|list|delete|rewrap|new-key`: the namespace's
//! secrets (docs/secrets.md). A value is read from standard input, never
//! from an argument (arguments land in shell histories and `ps`), and no
//! command prints one.

use std::io::Read;

use clap::{Args, Subcommand};
use composer_proto::v1::{
    DeleteSecretRequest, ListSecretsRequest, ListSecretsResponse, RewrapSecretKeysRequest,
    SetSecretRequest,
};

use super::{
    AdminError, Api, ClientArgs, Format,
    output::{Table, print_json, print_text, time},
    workflow::{PageArgs, more, page_size},
};

/// The most bytes read from standard input as a value (the server's limit).
const MAX_VALUE_BYTES: u64 = 64 * 1024;

/// The secret commands.
#[derive(Debug, Clone, Subcommand)]
pub enum SecretCommand {
    /// Store a new version of a secret, its value read from standard input.
    Set(SetArgs),
    /// List the namespace's secrets: names and versions, never values.
    List(ListArgs),
    /// Delete a secret and all its versions.
    Delete(NameArgs),
    /// Wrap the namespace's data key again under the server's first
    /// key-encryption key (after adding a new `--secrets-key-file` first).
    Rewrap(RewrapArgs),
    /// Print a new random key-encryption key for `--secrets-key-file`
    /// (local: no server is asked).
    NewKey,
}

/// Options of `secret set`.
#[derive(Debug, Clone, Args)]
pub struct SetArgs {
    /// The secret's name.
    pub name: String,
    /// Keep a final line end of the input (by default one trailing `\n`
    /// or `\r\n`, as `echo` and editors add, is dropped).
    #[arg(long)]
    pub keep_newline: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// A command about one secret.
#[derive(Debug, Clone, Args)]
pub struct NameArgs {
    /// The secret's name.
    pub name: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `secret list`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub page: PageArgs,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `secret rewrap`.
#[derive(Debug, Clone, Args)]
pub struct RewrapArgs {
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Runs one secret command.
pub async fn run(command: SecretCommand) -> Result<(), AdminError> {
    match command {
        SecretCommand::Set(args) => set(args).await,
        SecretCommand::List(args) => list(args).await,
        SecretCommand::Delete(args) => delete(args).await,
        SecretCommand::Rewrap(args) => rewrap(args).await,
        SecretCommand::NewKey => {
            let key = composer_coordinator::secrets::keys::new_hex_key()
                .map_err(|e| AdminError::Usage(e.to_string()))?;
            print_text(&format!("{key}\n"))
        }
    }
}

/// Standard input as a value, at most [`MAX_VALUE_BYTES`] (one byte more is
/// read, so the server refuses a longer one by its size).
fn read_value(keep_newline: bool) -> Result<Vec<u8>, AdminError> {
    let mut value = Vec::new();
    std::io::stdin()
        .take(MAX_VALUE_BYTES + 1)
        .read_to_end(&mut value)
        .map_err(|e| AdminError::Usage(format!("reading the value from standard input: {e}")))?;
    if !keep_newline {
        if value.ends_with(b"\r\n") {
            value.truncate(value.len() - 2);
        } else if value.ends_with(b"\n") {
            value.truncate(value.len() - 1);
        }
    }
    if value.is_empty() {
        return Err(AdminError::Usage(
            "the value is read from standard input, which was empty: \
             `composer secret set NAME < file` or `printf %s \"$VALUE\" | composer secret set NAME`"
                .into(),
        ));
    }
    Ok(value)
}

async fn set(args: SetArgs) -> Result<(), AdminError> {
    let value = read_value(args.keep_newline)?;
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .secrets
        .set_secret(SetSecretRequest {
            name: args.name,
            value,
        })
        .await?
        .into_inner();
    let secret = response.secret.clone().unwrap_or_default();
    match args.client.output {
        Format::Json => print_json(&response),
        Format::Table => print_text(&format!(
            "secret {} set: version {}\n",
            secret.name, secret.version
        )),
    }
}

async fn list(args: ListArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let mut all = ListSecretsResponse {
        next_page_token: args.page.page_token,
        ..Default::default()
    };
    let limit = args.page.limit as usize;
    loop {
        let page = api
            .secrets
            .list_secrets(ListSecretsRequest {
                page_size: page_size(limit - all.secrets.len()),
                page_token: all.next_page_token.clone(),
            })
            .await?
            .into_inner();
        all.secrets.extend(page.secrets);
        all.next_page_token = page.next_page_token;
        if all.next_page_token.is_empty() || all.secrets.len() >= limit {
            break;
        }
    }
    if args.client.output == Format::Json {
        return print_json(&all);
    }
    let mut table = Table::new(&["NAME", "VERSION", "UPDATED", "BY"]);
    for secret in &all.secrets {
        table.row(vec![
            secret.name.clone(),
            secret.version.to_string(),
            time(secret.update_time.as_ref()),
            secret.updated_by.clone(),
        ]);
    }
    print_text(&table.render())?;
    more(&all.next_page_token)
}

async fn delete(args: NameArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .secrets
        .delete_secret(DeleteSecretRequest {
            name: args.name.clone(),
        })
        .await?
        .into_inner();
    match args.client.output {
        Format::Json => print_json(&response),
        Format::Table => print_text(&format!("secret {} deleted\n", args.name)),
    }
}

async fn rewrap(args: RewrapArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .secrets
        .rewrap_secret_keys(RewrapSecretKeysRequest {})
        .await?
        .into_inner();
    match args.client.output {
        Format::Json => print_json(&response),
        Format::Table => print_text(&format!(
            "{} data key(s) wrapped again under key {}\n",
            response.rewrapped, response.key_id
        )),
    }
}
