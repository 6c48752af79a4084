//! `composer workflow register|validate|list|get|versions`: definitions on a
//! server (`composer workflow test` runs one offline instead).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use composer_proto::v1::{
    GetWorkflowRequest, ListWorkflowVersionsRequest, ListWorkflowVersionsResponse,
    ListWorkflowsRequest, ListWorkflowsResponse, RegisterWorkflowRequest, ValidateWorkflowRequest,
    WorkflowVersion,
};

use super::{
    AdminError, Api, ClientArgs, Format,
    output::{Table, fields, print_json, print_text, shorten, time},
    read_source,
};

/// The workflow commands that call a server.
#[derive(Debug, Clone, Subcommand)]
pub enum WorkflowCommand {
    /// Register a definition (a new version unless identical to the latest).
    Register(SourceArgs),
    /// Check a definition as register would, storing nothing.
    Validate(SourceArgs),
    /// List workflows with their latest version.
    List(ListArgs),
    /// Show one version of a workflow (the latest by default).
    Get(GetArgs),
    /// List the versions of a workflow, newest first.
    Versions(VersionsArgs),
    /// Replay a run's recorded history against a new definition: identical,
    /// compatible or incompatible (exit 1), with the first divergence named.
    Replay(super::replay::ReplayArgs),
    /// Replay every run in flight of a workflow (and, with --completed, the
    /// latest completed ones) against a new definition: counts per verdict,
    /// exit 1 if a run in flight is incompatible.
    Check(super::replay::CheckArgs),
}

/// A definition to send.
#[derive(Debug, Clone, Args)]
pub struct SourceArgs {
    /// The definition file (YAML or JSON), or `-` for standard input.
    pub file: PathBuf,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Paging of a list.
#[derive(Debug, Clone, Args)]
pub struct PageArgs {
    /// Print at most this many entries (fetched a page at a time).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    /// Continue from the `next_page_token` a previous listing printed.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub page_token: String,
}

/// Options of `workflow list`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Only names starting with this prefix.
    #[arg(long, default_value = "", hide_default_value = true)]
    pub prefix: String,
    #[command(flatten)]
    pub page: PageArgs,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `workflow get`.
#[derive(Debug, Clone, Args)]
pub struct GetArgs {
    /// The workflow's name.
    pub name: String,
    /// The version; the latest when left out.
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    pub version: i32,
    /// Print only the definition's text, as it was registered.
    #[arg(long)]
    pub source: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `workflow versions`.
#[derive(Debug, Clone, Args)]
pub struct VersionsArgs {
    /// The workflow's name.
    pub name: String,
    #[command(flatten)]
    pub page: PageArgs,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Runs one workflow command.
pub async fn run(command: WorkflowCommand) -> Result<(), AdminError> {
    match command {
        WorkflowCommand::Register(args) => register(args).await,
        WorkflowCommand::Validate(args) => validate(args).await,
        WorkflowCommand::List(args) => list(args).await,
        WorkflowCommand::Get(args) => get(args).await,
        WorkflowCommand::Versions(args) => versions(args).await,
        WorkflowCommand::Replay(args) => super::replay::replay_command(args).await,
        WorkflowCommand::Check(args) => super::replay::check_command(args).await,
    }
}

async fn register(args: SourceArgs) -> Result<(), AdminError> {
    let source = read_source(&args.file)?;
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .workflows
        .register_workflow(RegisterWorkflowRequest { source })
        .await?
        .into_inner();
    if args.client.output == Format::Json {
        return print_json(&response);
    }
    let workflow = response.workflow.unwrap_or_default();
    let what = if response.created {
        "registered"
    } else {
        "unchanged (identical to the latest version)"
    };
    print_text(&format!("{} v{} {what}\n", workflow.name, workflow.version))
}

async fn validate(args: SourceArgs) -> Result<(), AdminError> {
    let source = read_source(&args.file)?;
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .workflows
        .validate_workflow(ValidateWorkflowRequest { source })
        .await?
        .into_inner();
    match args.client.output {
        Format::Json => print_json(&response)?,
        Format::Table if response.valid => print_text("valid\n")?,
        Format::Table => {}
    }
    if response.valid {
        return Ok(());
    }
    Err(AdminError::Invalid(
        response
            .problems
            .into_iter()
            .map(|p| (p.path, p.message))
            .collect(),
    ))
}

async fn list(args: ListArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let mut all = ListWorkflowsResponse {
        next_page_token: args.page.page_token.clone(),
        ..Default::default()
    };
    loop {
        let wanted = args.page.limit as usize - all.workflows.len();
        let page = api
            .workflows
            .list_workflows(ListWorkflowsRequest {
                page_size: page_size(wanted),
                page_token: all.next_page_token.clone(),
                name_prefix: args.prefix.clone(),
            })
            .await?
            .into_inner();
        all.workflows.extend(page.workflows);
        all.next_page_token = page.next_page_token;
        if all.next_page_token.is_empty() || all.workflows.len() >= args.page.limit as usize {
            break;
        }
    }
    if args.client.output == Format::Json {
        return print_json(&all);
    }
    let mut table = Table::new(&["NAME", "LATEST", "UPDATED", "DESCRIPTION"]);
    for workflow in &all.workflows {
        table.row(vec![
            workflow.name.clone(),
            format!("v{}", workflow.latest_version),
            time(workflow.update_time.as_ref()),
            shorten(&workflow.description, 60),
        ]);
    }
    print_text(&table.render())?;
    more(&all.next_page_token)
}

async fn get(args: GetArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let response = api
        .workflows
        .get_workflow(GetWorkflowRequest {
            name: args.name,
            version: args.version,
        })
        .await?
        .into_inner();
    if args.client.output == Format::Json {
        return print_json(&response);
    }
    let workflow = response.workflow.unwrap_or_default();
    if args.source {
        return print_text(&with_newline(&workflow.source));
    }
    print_text(&format!(
        "{}\n{}",
        describe(&workflow),
        with_newline(&workflow.source)
    ))
}

async fn versions(args: VersionsArgs) -> Result<(), AdminError> {
    let mut api = Api::connect(&args.client.connect).await?;
    let mut all = ListWorkflowVersionsResponse {
        next_page_token: args.page.page_token.clone(),
        ..Default::default()
    };
    loop {
        let wanted = args.page.limit as usize - all.versions.len();
        let page = api
            .workflows
            .list_workflow_versions(ListWorkflowVersionsRequest {
                name: args.name.clone(),
                page_size: page_size(wanted),
                page_token: all.next_page_token.clone(),
            })
            .await?
            .into_inner();
        all.versions.extend(page.versions);
        all.next_page_token = page.next_page_token;
        if all.next_page_token.is_empty() || all.versions.len() >= args.page.limit as usize {
            break;
        }
    }
    if args.client.output == Format::Json {
        return print_json(&all);
    }
    let mut table = Table::new(&["VERSION", "CREATED", "HASH", "DESCRIPTION"]);
    for version in &all.versions {
        table.row(vec![
            format!("v{}", version.version),
            time(version.create_time.as_ref()),
            version.content_hash.chars().take(12).collect(),
            shorten(&version.description, 60),
        ]);
    }
    print_text(&table.render())?;
    more(&all.next_page_token)
}

fn describe(workflow: &WorkflowVersion) -> String {
    fields(&[
        ("name", workflow.name.clone()),
        ("version", format!("v{}", workflow.version)),
        ("namespace", workflow.namespace.clone()),
        ("description", workflow.description.clone()),
        ("created", time(workflow.create_time.as_ref())),
        ("content hash", workflow.content_hash.clone()),
    ])
}

fn with_newline(text: &str) -> String {
    if text.ends_with('\n') {
        text.to_owned()
    } else {
        format!("{text}\n")
    }
}

/// The page size to ask for: what is still wanted, at most the API's 1000.
pub fn page_size(wanted: usize) -> i32 {
    wanted.clamp(1, 1000) as i32
}

/// Tells on standard error how to get the next page, if there is one.
pub fn more(next_page_token: &str) -> Result<(), AdminError> {
    if !next_page_token.is_empty() {
        eprintln!("more: --page-token {next_page_token}");
    }
    Ok(())
}
