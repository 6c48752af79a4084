package composer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// ReplayVerdict says whether a new definition could continue a run
// (docs/versions.md).
type ReplayVerdict int32

// The verdicts of composer.v1.ReplayVerdict.
const (
	ReplayVerdictUnspecified ReplayVerdict = ReplayVerdict(pb.ReplayVerdict_REPLAY_VERDICT_UNSPECIFIED)
	// ReplayIdentical: every recorded decision is the same, and nothing the
	// run has not reached differs.
	ReplayIdentical ReplayVerdict = ReplayVerdict(pb.ReplayVerdict_REPLAY_VERDICT_IDENTICAL)
	// ReplayCompatible: the same nodes start in the same order with the same
	// work; RunReplay.Differences lists what differs.
	ReplayCompatible ReplayVerdict = ReplayVerdict(pb.ReplayVerdict_REPLAY_VERDICT_COMPATIBLE)
	// ReplayIncompatible: the new definition parts from what the run did;
	// RunReplay.Divergence says where.
	ReplayIncompatible ReplayVerdict = ReplayVerdict(pb.ReplayVerdict_REPLAY_VERDICT_INCOMPATIBLE)
	// ReplayUnreplayable: the history is not what the run's own definition
	// decides (cut short, edited, or recorded by another engine);
	// RunReplay.UnreplayableReason says why.
	ReplayUnreplayable ReplayVerdict = ReplayVerdict(pb.ReplayVerdict_REPLAY_VERDICT_UNREPLAYABLE)
)

// String is the verdict's name without its prefix, e.g. COMPATIBLE.
func (v ReplayVerdict) String() string {
	return strings.TrimPrefix(pb.ReplayVerdict(v).String(), "REPLAY_VERDICT_")
}

// ReplayDivergence is where a new definition first parts from a run.
type ReplayDivergence struct {
	// Rule is the rule broken, as docs/versions.md names it (node_changed,
	// branch_changed, waiting_node_removed, ...).
	Rule string
	// NodeID is the node (its recorded id), if one.
	NodeID string
	// Sequence is the history entry where it shows, 0 if none.
	Sequence int64
	// Message says what differs, in words.
	Message string
}

// ReplayDifference is one difference that does not stop a run going on.
type ReplayDifference struct {
	// Kind is node_added, node_changed, node_removed, input_differs or
	// node_renamed.
	Kind    string
	NodeID  string
	Message string
}

// RunReplay is what a new definition would do with one run.
type RunReplay struct {
	RunID string
	// WorkflowVersion is the version the run is on.
	WorkflowVersion int
	Status          RunStatus
	Verdict         ReplayVerdict
	// Divergence is set when the verdict is ReplayIncompatible.
	Divergence *ReplayDivergence
	// Differences are a compatible run's differences (at most 20).
	Differences []ReplayDifference
	// UnreplayableReason says why an unreplayable run could not be replayed.
	UnreplayableReason string
	// Events counts the events rebuilt from the history and replayed.
	Events int
}

func runReplayFrom(r *pb.RunReplay) *RunReplay {
	out := &RunReplay{
		RunID: r.GetRunId(), WorkflowVersion: int(r.GetWorkflowVersion()), Status: RunStatus(r.GetStatus()),
		Verdict: ReplayVerdict(r.GetVerdict()), UnreplayableReason: r.GetUnreplayableReason(), Events: int(r.GetEvents()),
	}
	if d := r.GetDivergence(); d != nil {
		out.Divergence = &ReplayDivergence{Rule: d.GetRule(), NodeID: d.GetNodeId(), Sequence: d.GetSequence(), Message: d.GetMessage()}
	}
	for _, d := range r.GetDifferences() {
		out.Differences = append(out.Differences, ReplayDifference{Kind: d.GetKind(), NodeID: d.GetNodeId(), Message: d.GetMessage()})
	}
	return out
}

// ReplaySubject is the run ReplayRun replays: RunByID names a run the
// server reads, a *RecordedRun (ParseRecordedRun) gives one whole.
type ReplaySubject interface {
	setRecorded(req *pb.ReplayRunRequest) error
}

type runByID string

func (id runByID) setRecorded(req *pb.ReplayRunRequest) error {
	if id == "" {
		return invalidArgument("run_id", "name a run, or give its history")
	}
	req.Recorded = &pb.ReplayRunRequest_RunId{RunId: string(id)}
	return nil
}

// RunByID is a run of the caller's namespace for ReplayRun, which the
// server reads with its history and definition.
func RunByID(runID string) ReplaySubject { return runByID(runID) }

// RecordedRun is a run as recorded: the run with its nodes' outputs, the
// definition it runs on and its whole history, what `composer run history
// RUN_ID -o json` writes. ReplayRun replays it with nothing read from the
// server, so a history saved earlier, or on another cluster, can be
// checked against a new definition.
type RecordedRun struct {
	msg *pb.RecordedRun
}

// ParseRecordedRun reads a recorded run from the JSON `composer run history
// RUN_ID -o json` writes: an object with "run", "workflow" (with its
// "source") and "events", under the API's field names; other keys are
// ignored. A history cut short (a non-empty "next_page_token": written
// with a --limit below its length) is refused, as it could not replay.
func ParseRecordedRun(data []byte) (*RecordedRun, error) {
	var page struct {
		NextPageToken string `json:"next_page_token"`
	}
	if err := json.Unmarshal(data, &page); err != nil {
		return nil, fmt.Errorf("composer: a recorded run: not a JSON object: %w", err)
	}
	if page.NextPageToken != "" {
		return nil, errors.New("composer: a recorded run: the history is cut short (next_page_token is set): write it with a --limit above its length")
	}
	msg := &pb.RecordedRun{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, msg); err != nil {
		return nil, fmt.Errorf("composer: a recorded run: %w", err)
	}
	switch {
	case msg.GetRun() == nil:
		return nil, errors.New(`composer: a recorded run: no "run" (write it with composer run history RUN_ID -o json)`)
	case strings.TrimSpace(msg.GetWorkflow().GetSource()) == "":
		return nil, errors.New(`composer: a recorded run: no "workflow" with its source (write it with composer run history RUN_ID -o json)`)
	case len(msg.GetEvents()) == 0:
		return nil, errors.New(`composer: a recorded run: no "events" (write it with composer run history RUN_ID -o json)`)
	}
	return &RecordedRun{msg: msg}, nil
}

// Run is the recorded run, with its nodes' states and outputs.
func (r *RecordedRun) Run() *Run { return runFrom(r.msg.GetRun()) }

// Workflow is the version the run ran on, with its Source.
func (r *RecordedRun) Workflow() *WorkflowVersion { return workflowFrom(r.msg.GetWorkflow(), false) }

// Events is the run's history, oldest first.
func (r *RecordedRun) Events() []*HistoryEvent { return convertAll(r.msg.GetEvents(), historyFrom) }

func (r *RecordedRun) setRecorded(req *pb.ReplayRunRequest) error {
	if r == nil || r.msg == nil {
		return invalidArgument("history", "a nil RecordedRun: read one with ParseRecordedRun")
	}
	req.Recorded = &pb.ReplayRunRequest_History{History: r.msg}
	return nil
}

// ReplayOptions is the new definition a run is replayed against: Source,
// or a registered Version of the run's workflow (exactly one), and the
// nodes it renames.
type ReplayOptions struct {
	// Source is the new definition's text: YAML(b), File(path) or
	// Definition(v), as for RegisterWorkflow.
	Source Source
	// Version is a registered version of the run's workflow, when Source is nil.
	Version int
	// NodeMapping names the nodes renamed in the new definition: recorded
	// id to new id.
	NodeMapping map[string]string
}

// newDefinition is the source text or version a request carries, checked.
func newDefinition(src Source, version int) (string, int32, error) {
	switch {
	case src != nil && version != 0:
		return "", 0, invalidArgument("version", "give the new definition's Source or a registered Version, not both")
	case src == nil && version == 0:
		return "", 0, invalidArgument("source", "give the new definition's text (Source) or a registered Version")
	case src == nil && version < 0:
		return "", 0, invalidArgument("version", "must be positive")
	case src == nil:
		return "", int32(version), nil
	}
	text, err := src.text()
	if err != nil {
		return "", 0, err
	}
	if strings.TrimSpace(text) == "" {
		return "", 0, invalidArgument("source", "the new definition's text is empty")
	}
	return text, 0, nil
}

// checkNodeMapping refuses an empty node id on either side of a rename.
func checkNodeMapping(mapping map[string]string) error {
	for from, to := range mapping {
		if strings.TrimSpace(from) == "" || strings.TrimSpace(to) == "" {
			return invalidArgument("node_mapping", fmt.Sprintf("%q=%q: a rename needs the recorded id and the new id", from, to))
		}
	}
	return nil
}

// ReplayRun replays one run's recorded history against a new definition and
// says whether that definition could continue the run (docs/versions.md):
// ReplayIdentical, ReplayCompatible with its Differences, ReplayIncompatible
// with the first Divergence, or ReplayUnreplayable with the reason when the
// run's own definition does not reproduce its history. The run is
// RunByID(id), read from the server, or a *RecordedRun given whole (then
// the server reads nothing but a Version, from the run's workflow in the
// caller's namespace). Nothing is stored.
//
// Neither or both of opts.Source and opts.Version, or an empty node id in
// opts.NodeMapping, is INVALID_ARGUMENT before any call; an invalid Source
// is INVALID_ARGUMENT with a violation per problem, as RegisterWorkflow
// says; an unknown run is NOT_FOUND.
func (c *Client) ReplayRun(ctx context.Context, run ReplaySubject, opts ReplayOptions) (*RunReplay, error) {
	if run == nil {
		return nil, invalidArgument("run_id", "name a run (RunByID) or give its history (ParseRecordedRun)")
	}
	source, version, err := newDefinition(opts.Source, opts.Version)
	if err != nil {
		return nil, err
	}
	if err := checkNodeMapping(opts.NodeMapping); err != nil {
		return nil, err
	}
	req := &pb.ReplayRunRequest{Source: source, Version: version, NodeMapping: opts.NodeMapping}
	if err := run.setRecorded(req); err != nil {
		return nil, err
	}
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.workflows.ReplayRun(ctx, req, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return runReplayFrom(r.GetReplay()), nil
}

// CheckScope picks the runs CheckWorkflowVersion replays.
type CheckScope int32

// The scopes of composer.v1.CheckScope.
const (
	// CheckScopeUnspecified is CheckInFlight.
	CheckScopeUnspecified CheckScope = CheckScope(pb.CheckScope_CHECK_SCOPE_UNSPECIFIED)
	// CheckInFlight: the runs in flight (RUNNING, COMPENSATING, PAUSED).
	CheckInFlight CheckScope = CheckScope(pb.CheckScope_CHECK_SCOPE_IN_FLIGHT)
	// CheckCompleted: the runs that completed, newest first.
	CheckCompleted CheckScope = CheckScope(pb.CheckScope_CHECK_SCOPE_COMPLETED)
)

// String is the scope's name without its prefix, e.g. IN_FLIGHT.
func (s CheckScope) String() string {
	return strings.TrimPrefix(pb.CheckScope(s).String(), "CHECK_SCOPE_")
}

// CheckWorkflowVersionOptions is the new definition CheckWorkflowVersion
// replays runs against (Source or Version, and NodeMapping, as for
// ReplayRun) and the runs it replays.
type CheckWorkflowVersionOptions struct {
	// Source is the new definition's text: YAML(b), File(path) or Definition(v).
	Source Source
	// Version is a registered version of the workflow, when Source is nil.
	Version int
	// NodeMapping names the nodes renamed in the new definition: recorded
	// id to new id.
	NodeMapping map[string]string
	// Scope is which runs: CheckInFlight (the zero value) or CheckCompleted.
	Scope CheckScope
	// Limit, with CheckCompleted, replays only the Limit most recent
	// completed runs; 0 replays them all. Every run in flight is always
	// replayed.
	Limit int
	// PageSize is the number of runs the server replays per call (0: 200;
	// at most 500).
	PageSize int
}

// WorkflowVersionCheck is the verdicts of every run a check replayed.
type WorkflowVersionCheck struct {
	// Checked counts the runs replayed; the four counts below add up to it.
	Checked      int
	Identical    int
	Compatible   int
	Incompatible int
	Unreplayable int
	// Runs lists every run replayed that is not identical, with its
	// verdict, newest first.
	Runs []*RunReplay
}

// CheckWorkflowVersion replays the runs of the workflow name (of every
// version) against a new definition and adds up their verdicts: the runs in
// flight, or with opts.Scope CheckCompleted the completed ones, newest first
// (opts.Limit of them, or all). The server replays them a page per call;
// this fetches every page, each call with the Client's timeout. Nothing is
// stored. Argument errors as ReplayRun's, and a negative Limit, a Limit
// outside CheckCompleted or a negative PageSize, are INVALID_ARGUMENT before
// any call.
func (c *Client) CheckWorkflowVersion(ctx context.Context, name string, opts CheckWorkflowVersionOptions) (*WorkflowVersionCheck, error) {
	req, err := checkRequest(name, opts)
	if err != nil {
		return nil, err
	}
	check := &WorkflowVersionCheck{}
	pageSize := opts.PageSize
	if pageSize == 0 {
		pageSize = defaultCheckPage
	}
	fetch := func(ctx context.Context, token string) (*pb.CheckWorkflowVersionResponse, string, error) {
		// pages asks for the next page only once this one is added up
		req.PageToken, req.PageSize = token, int32(pageSize)
		if opts.Limit > 0 {
			req.PageSize = int32(min(pageSize, opts.Limit-check.Checked))
		}
		r, err := c.workflows.CheckWorkflowVersion(ctx, req, waitForReady)
		return r, r.GetNextPageToken(), err
	}
	for page, err := range pages(ctx, c, fetch) {
		if err != nil {
			return nil, err
		}
		check.add(page)
		if opts.Limit > 0 && check.Checked >= opts.Limit {
			break
		}
	}
	return check, nil
}

// defaultCheckPage is the server's page of CheckWorkflowVersion, asked for
// explicitly so a Limit can shorten the last page.
const defaultCheckPage = 200

func checkRequest(name string, opts CheckWorkflowVersionOptions) (*pb.CheckWorkflowVersionRequest, error) {
	switch {
	case name == "":
		return nil, invalidArgument("name", "name the workflow whose runs to replay")
	case opts.Scope != CheckScopeUnspecified && opts.Scope != CheckInFlight && opts.Scope != CheckCompleted:
		return nil, invalidArgument("scope", fmt.Sprintf("unknown scope %d", opts.Scope))
	case opts.Limit < 0:
		return nil, invalidArgument("limit", "must not be negative")
	case opts.Limit > 0 && opts.Scope != CheckCompleted:
		return nil, invalidArgument("limit", "applies to the completed runs (CheckCompleted): every run in flight is replayed")
	case opts.PageSize < 0:
		return nil, invalidArgument("page_size", "must not be negative")
	}
	source, version, err := newDefinition(opts.Source, opts.Version)
	if err != nil {
		return nil, err
	}
	if err := checkNodeMapping(opts.NodeMapping); err != nil {
		return nil, err
	}
	return &pb.CheckWorkflowVersionRequest{
		Name: name, Source: source, Version: version, NodeMapping: opts.NodeMapping, Scope: pb.CheckScope(opts.Scope),
	}, nil
}

// add counts one page's verdicts.
func (c *WorkflowVersionCheck) add(page *pb.CheckWorkflowVersionResponse) {
	c.Checked += int(page.GetChecked())
	c.Identical += int(page.GetIdentical())
	c.Compatible += int(page.GetCompatible())
	c.Incompatible += int(page.GetIncompatible())
	c.Unreplayable += int(page.GetUnreplayable())
	c.Runs = append(c.Runs, convertAll(page.GetRuns(), runReplayFrom)...)
}
