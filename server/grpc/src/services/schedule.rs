//! `ScheduleService`: schedules that start runs on a timetable.

use std::collections::HashMap;

use composer_coordinator::{
    Coordinator,
    time::schedules::{
        DEFAULT_CATCH_UP_WINDOW_MS, Fire, FireOutcome, Overlap, ScheduleAction, ScheduleRequest,
        ScheduleView, SpecRequest, StoredSpec,
    },
};
use composer_proto::v1::{
    CreateScheduleRequest, CreateScheduleResponse, DeleteScheduleRequest, DeleteScheduleResponse,
    GetScheduleRequest, GetScheduleResponse, ListSchedulesRequest, ListSchedulesResponse,
    OverlapPolicy, PauseScheduleRequest, PauseScheduleResponse, ResumeScheduleRequest,
    ResumeScheduleResponse, Schedule, ScheduleFire, ScheduleFireOutcome, ScheduleSpec,
    TriggerScheduleRequest, TriggerScheduleResponse, UpdateScheduleRequest, UpdateScheduleResponse,
    schedule_service_server::ScheduleService,
};
use tonic::{Request, Response, Status};

use crate::{
    caller::caller,
    convert::{from_json, keyset_page, page_size, page_token, timestamp, to_json},
    services::run_fields::{MAX_LABELS, check_label_keys},
    status::{
        MAX_KEY_BYTES, MAX_TEXT_BYTES, check_name, check_text, from_coordinator, invalid_field,
    },
};

/// The ScheduleService implementation.
#[derive(Clone)]
pub(crate) struct ScheduleApi {
    pub(crate) coordinator: Coordinator,
}

fn overlap(number: i32) -> Result<Overlap, Status> {
    match OverlapPolicy::try_from(number) {
        Ok(OverlapPolicy::Unspecified | OverlapPolicy::Skip) => Ok(Overlap::Skip),
        Ok(OverlapPolicy::BufferOne) => Ok(Overlap::BufferOne),
        Ok(OverlapPolicy::AllowAll) => Ok(Overlap::AllowAll),
        Ok(OverlapPolicy::CancelPrevious) => Ok(Overlap::CancelPrevious),
        Err(_) => Err(invalid_field(
            "overlap_policy",
            format!("{number} is not an OverlapPolicy"),
        )),
    }
}

fn overlap_message(overlap: Overlap) -> OverlapPolicy {
    match overlap {
        Overlap::Skip => OverlapPolicy::Skip,
        Overlap::BufferOne => OverlapPolicy::BufferOne,
        Overlap::AllowAll => OverlapPolicy::AllowAll,
        Overlap::CancelPrevious => OverlapPolicy::CancelPrevious,
    }
}

/// A Duration as milliseconds; `field` names it. Negative or sub-millisecond
/// parts are refused.
fn millis(duration: &prost_types::Duration, field: &str) -> Result<i64, Status> {
    if duration.seconds < 0 || duration.nanos < 0 || duration.nanos >= 1_000_000_000 {
        return Err(invalid_field(field, "must not be negative"));
    }
    if duration.nanos % 1_000_000 != 0 {
        return Err(invalid_field(field, "must be whole milliseconds"));
    }
    duration
        .seconds
        .checked_mul(1000)
        .and_then(|ms| ms.checked_add(i64::from(duration.nanos / 1_000_000)))
        .ok_or_else(|| invalid_field(field, "is out of range"))
}

fn duration_message(ms: i64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: ms.div_euclid(1000),
        nanos: i32::try_from(ms.rem_euclid(1000) * 1_000_000).unwrap_or(0),
    }
}

fn spec_request(spec: Option<ScheduleSpec>) -> Result<SpecRequest, Status> {
    let spec = spec.ok_or_else(|| invalid_field("spec", "is required: a cron or an interval"))?;
    match (spec.cron.is_empty(), spec.interval) {
        (false, None) => {
            check_text("spec.cron", &spec.cron, MAX_KEY_BYTES)?;
            check_text("spec.time_zone", &spec.time_zone, 64)?;
            Ok(SpecRequest::Cron {
                expression: spec.cron,
                time_zone: spec.time_zone,
            })
        }
        (true, Some(interval)) => {
            if !spec.time_zone.is_empty() {
                return Err(invalid_field(
                    "spec.time_zone",
                    "applies to cron only; an interval has no time zone",
                ));
            }
            let ms = millis(&interval, "spec.interval")?;
            if ms % 1000 != 0 {
                return Err(invalid_field("spec.interval", "must be whole seconds"));
            }
            Ok(SpecRequest::Interval {
                every_secs: ms / 1000,
            })
        }
        (false, Some(_)) => Err(invalid_field(
            "spec",
            "holds both cron and interval; give exactly one",
        )),
        (true, None) => Err(invalid_field(
            "spec",
            "holds neither cron nor interval; give one",
        )),
    }
}

/// Checks what every definition holds and builds the coordinator's request.
#[allow(clippy::too_many_arguments)]
fn schedule_request(
    namespace: String,
    id: String,
    spec: Option<ScheduleSpec>,
    action: Option<composer_proto::v1::ScheduleAction>,
    overlap_policy: i32,
    catch_up_window: Option<prost_types::Duration>,
    jitter: Option<prost_types::Duration>,
) -> Result<ScheduleRequest, Status> {
    check_name("schedule_id", &id)?;
    let spec = spec_request(spec)?;
    let action = action.ok_or_else(|| invalid_field("action", "is required"))?;
    check_name("action.workflow_name", &action.workflow_name)?;
    if action.version < 0 {
        return Err(invalid_field(
            "action.version",
            "must be 0 (latest) or a version number",
        ));
    }
    if action.labels.len() > MAX_LABELS - 2 {
        return Err(invalid_field(
            "action.labels",
            format!(
                "{} labels; at most {} are allowed (a run carries two more)",
                action.labels.len(),
                MAX_LABELS - 2
            ),
        ));
    }
    check_label_keys(&action.labels).map_err(|status| {
        // the same check as StartRun's, with the field path of this request
        let violations = tonic_types::StatusExt::get_details_bad_request(&status);
        match violations.and_then(|v| v.field_violations.into_iter().next()) {
            Some(v) => invalid_field(&format!("action.{}", v.field), v.description),
            None => status,
        }
    })?;
    let input = to_json(action.input, "action.input")?;
    let overlap = overlap(overlap_policy)?;
    let catch_up_window_ms = match catch_up_window {
        None => DEFAULT_CATCH_UP_WINDOW_MS,
        Some(window) => millis(&window, "catch_up_window")?,
    };
    let jitter_ms = match jitter {
        None => 0,
        Some(jitter) => millis(&jitter, "jitter")?,
    };
    Ok(ScheduleRequest {
        namespace,
        id,
        spec,
        action: ScheduleAction {
            workflow_name: action.workflow_name,
            version: (action.version > 0).then_some(action.version),
            input,
            labels: action.labels.into_iter().collect(),
        },
        overlap,
        catch_up_window_ms,
        jitter_ms,
    })
}

fn fire_message(fire: &Fire) -> ScheduleFire {
    ScheduleFire {
        fire_time: Some(timestamp(fire.fire_time)),
        run_id: fire.run_id.map(|id| id.to_string()).unwrap_or_default(),
        outcome: match fire.outcome {
            FireOutcome::Started => ScheduleFireOutcome::Started,
            FireOutcome::Skipped => ScheduleFireOutcome::Skipped,
            FireOutcome::Buffered => ScheduleFireOutcome::Buffered,
            FireOutcome::Failed => ScheduleFireOutcome::Failed,
        } as i32,
    }
}

fn schedule_message(view: ScheduleView) -> Schedule {
    let spec = match &view.spec {
        StoredSpec::Cron {
            expression,
            time_zone,
        } => ScheduleSpec {
            cron: expression.clone(),
            time_zone: time_zone.clone(),
            interval: None,
        },
        StoredSpec::Interval { every_secs, .. } => ScheduleSpec {
            cron: String::new(),
            time_zone: String::new(),
            interval: Some(prost_types::Duration {
                seconds: *every_secs,
                nanos: 0,
            }),
        },
    };
    let row = view.row;
    Schedule {
        schedule_id: row.id,
        namespace: row.namespace,
        spec: Some(spec),
        action: Some(composer_proto::v1::ScheduleAction {
            workflow_name: view.action.workflow_name,
            version: view.action.version.unwrap_or(0),
            input: Some(from_json(&view.action.input)),
            labels: view.action.labels.into_iter().collect::<HashMap<_, _>>(),
        }),
        overlap_policy: overlap_message(view.overlap) as i32,
        catch_up_window: Some(duration_message(row.catch_up_window_ms)),
        jitter: Some(duration_message(row.jitter_ms)),
        paused: row.paused,
        note: row.note,
        recent_fires: view.recent_fires.iter().map(fire_message).collect(),
        next_fire_times: view.next_fires.into_iter().map(timestamp).collect(),
        fired_count: row.fired_count,
        skipped_count: row.skipped_count,
        missed_count: row.missed_count,
        last_error: row.last_error.unwrap_or_default(),
        buffered_fire_time: row.buffered_fire_at.map(timestamp),
        create_time: Some(timestamp(row.created_at)),
        update_time: Some(timestamp(row.updated_at)),
    }
}

fn require_id(id: &str) -> Result<(), Status> {
    check_name("schedule_id", id)
}

#[tonic::async_trait]
impl ScheduleService for ScheduleApi {
    async fn create_schedule(
        &self,
        request: Request<CreateScheduleRequest>,
    ) -> Result<Response<CreateScheduleResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        check_text("note", &request.note, MAX_TEXT_BYTES)?;
        let definition = schedule_request(
            caller.namespace,
            request.schedule_id,
            request.spec,
            request.action,
            request.overlap_policy,
            request.catch_up_window,
            request.jitter,
        )?;
        let view = self
            .coordinator
            .create_schedule(definition, request.paused, &request.note)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(CreateScheduleResponse {
            schedule: Some(schedule_message(view)),
        }))
    }

    async fn get_schedule(
        &self,
        request: Request<GetScheduleRequest>,
    ) -> Result<Response<GetScheduleResponse>, Status> {
        let caller = caller(&request)?;
        let id = request.into_inner().schedule_id;
        require_id(&id)?;
        let view = self
            .coordinator
            .get_schedule(&caller.namespace, &id)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(GetScheduleResponse {
            schedule: Some(schedule_message(view)),
        }))
    }

    async fn list_schedules(
        &self,
        request: Request<ListSchedulesRequest>,
    ) -> Result<Response<ListSchedulesResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let limit = page_size(request.page_size)?;
        let after = page_token(&request.page_token, |token| {
            check_name("page_token", token).ok().map(|()| token)
        })?;
        let views = self
            .coordinator
            .list_schedules(&caller.namespace, after, limit + 1)
            .await
            .map_err(from_coordinator)?;
        let (page, next_page_token) = keyset_page(views, limit, |last| last.row.id.clone());
        Ok(Response::new(ListSchedulesResponse {
            schedules: page.into_iter().map(schedule_message).collect(),
            next_page_token,
        }))
    }

    async fn update_schedule(
        &self,
        request: Request<UpdateScheduleRequest>,
    ) -> Result<Response<UpdateScheduleResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let definition = schedule_request(
            caller.namespace,
            request.schedule_id,
            request.spec,
            request.action,
            request.overlap_policy,
            request.catch_up_window,
            request.jitter,
        )?;
        let view = self
            .coordinator
            .update_schedule(definition)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(UpdateScheduleResponse {
            schedule: Some(schedule_message(view)),
        }))
    }

    async fn pause_schedule(
        &self,
        request: Request<PauseScheduleRequest>,
    ) -> Result<Response<PauseScheduleResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        require_id(&request.schedule_id)?;
        check_text("note", &request.note, MAX_TEXT_BYTES)?;
        let view = self
            .coordinator
            .pause_schedule(&caller.namespace, &request.schedule_id, true, &request.note)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(PauseScheduleResponse {
            schedule: Some(schedule_message(view)),
        }))
    }

    async fn resume_schedule(
        &self,
        request: Request<ResumeScheduleRequest>,
    ) -> Result<Response<ResumeScheduleResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        require_id(&request.schedule_id)?;
        check_text("note", &request.note, MAX_TEXT_BYTES)?;
        let view = self
            .coordinator
            .pause_schedule(
                &caller.namespace,
                &request.schedule_id,
                false,
                &request.note,
            )
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(ResumeScheduleResponse {
            schedule: Some(schedule_message(view)),
        }))
    }

    async fn delete_schedule(
        &self,
        request: Request<DeleteScheduleRequest>,
    ) -> Result<Response<DeleteScheduleResponse>, Status> {
        let caller = caller(&request)?;
        let id = request.into_inner().schedule_id;
        require_id(&id)?;
        self.coordinator
            .delete_schedule(&caller.namespace, &id)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(DeleteScheduleResponse {}))
    }

    async fn trigger_schedule(
        &self,
        request: Request<TriggerScheduleRequest>,
    ) -> Result<Response<TriggerScheduleResponse>, Status> {
        let caller = caller(&request)?;
        let id = request.into_inner().schedule_id;
        require_id(&id)?;
        let fire = self
            .coordinator
            .trigger_schedule(&caller.namespace, &id)
            .await
            .map_err(from_coordinator)?;
        Ok(Response::new(TriggerScheduleResponse {
            fire: Some(fire_message(&fire)),
        }))
    }
}
