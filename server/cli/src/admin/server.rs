//! `composer server info`: what the server is and speaks.

use clap::{Args, Subcommand};
use composer_proto::v1::GetServerInfoRequest;

use super::{
    AdminError, Api, ClientArgs, Format,
    output::{fields, print_json, print_text},
};

/// The server commands.
#[derive(Debug, Clone, Subcommand)]
pub enum ServerCommand {
    /// Show the server's version, protocol version and features.
    Info(InfoArgs),
}

/// Options of `server info`.
#[derive(Debug, Clone, Args)]
pub struct InfoArgs {
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Runs one server command.
pub async fn run(command: ServerCommand) -> Result<(), AdminError> {
    let ServerCommand::Info(args) = command;
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .server
        .get_server_info(GetServerInfoRequest {})
        .await?
        .into_inner();
    if args.client.output == Format::Json {
        return print_json(&response);
    }
    print_text(&fields(&[
        ("address", args.client.connect.address.clone()),
        ("server version", response.server_version),
        ("protocol version", response.protocol_version),
        (
            "client protocol",
            composer_proto::PROTOCOL_VERSION.to_owned(),
        ),
        ("features", response.features.join(", ")),
    ]))
}
