package composer

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// RunStatus is where a run is in its life.
type RunStatus int32

// The run statuses of composer.v1.RunStatus.
const (
	RunStatusUnspecified RunStatus = RunStatus(pb.RunStatus_RUN_STATUS_UNSPECIFIED)
	RunRunning           RunStatus = RunStatus(pb.RunStatus_RUN_STATUS_RUNNING)
	RunCompensating      RunStatus = RunStatus(pb.RunStatus_RUN_STATUS_COMPENSATING)
	RunCompleted         RunStatus = RunStatus(pb.RunStatus_RUN_STATUS_COMPLETED)
	RunFailed            RunStatus = RunStatus(pb.RunStatus_RUN_STATUS_FAILED)
	RunCancelled         RunStatus = RunStatus(pb.RunStatus_RUN_STATUS_CANCELLED)
	// RunPaused: PauseRun paused the run; it dispatches no task and fires no
	// timer until ResumeRun.
	RunPaused RunStatus = RunStatus(pb.RunStatus_RUN_STATUS_PAUSED)
	// RunQueued: the run waits for a slot of its workflow's concurrency key
	// (Run.ConcurrencyKey) and has started no node; it becomes RUNNING when
	// a run of that key ends, in the order the key's runs arrived.
	RunQueued RunStatus = RunStatus(pb.RunStatus_RUN_STATUS_QUEUED)
)

// String is the status's name without its prefix, e.g. COMPLETED.
func (s RunStatus) String() string {
	return strings.TrimPrefix(pb.RunStatus(s).String(), "RUN_STATUS_")
}

// IsFinal reports whether the run ended (COMPLETED, FAILED or CANCELLED).
func (s RunStatus) IsFinal() bool {
	return s == RunCompleted || s == RunFailed || s == RunCancelled
}

// NodeStatus is where one node (or one MAP element) of a run is.
type NodeStatus int32

// The node statuses of composer.v1.NodeStatus.
const (
	NodeStatusUnspecified NodeStatus = NodeStatus(pb.NodeStatus_NODE_STATUS_UNSPECIFIED)
	NodeScheduled         NodeStatus = NodeStatus(pb.NodeStatus_NODE_STATUS_SCHEDULED)
	NodeRunning           NodeStatus = NodeStatus(pb.NodeStatus_NODE_STATUS_RUNNING)
	NodeWaiting           NodeStatus = NodeStatus(pb.NodeStatus_NODE_STATUS_WAITING)
	NodeCompleted         NodeStatus = NodeStatus(pb.NodeStatus_NODE_STATUS_COMPLETED)
	NodeFailed            NodeStatus = NodeStatus(pb.NodeStatus_NODE_STATUS_FAILED)
	NodeSkipped           NodeStatus = NodeStatus(pb.NodeStatus_NODE_STATUS_SKIPPED)
	NodeCancelled         NodeStatus = NodeStatus(pb.NodeStatus_NODE_STATUS_CANCELLED)
)

// String is the status's name without its prefix, e.g. COMPLETED.
func (s NodeStatus) String() string {
	return strings.TrimPrefix(pb.NodeStatus(s).String(), "NODE_STATUS_")
}

// Failure says why a node or a run failed.
type Failure struct {
	// Code is a worker's own code or one of the engine's (TIMEOUT, LEASE_EXPIRED, ...).
	Code    string
	Message string
	// NodeID is the failed node, empty for run-level failures.
	NodeID string
	// Details are the structured details reported with the failure, as JSON.
	Details json.RawMessage
}

// NodeState is the state of one node of a run.
type NodeState struct {
	NodeID    string
	NodeType  string
	Status    NodeStatus
	Attempt   int
	Output    json.RawMessage
	Error     *Failure
	StartTime time.Time
	EndTime   time.Time
	// Input is, for a node a worker runs, the input it gets (templates rendered).
	Input json.RawMessage
	// WorkerID is the worker that holds (or last held) its task's lease.
	WorkerID string
	// LeaseExpireTime is when the current lease ends; zero when not leased.
	LeaseExpireTime time.Time
}

// Run is one execution of a workflow version.
type Run struct {
	ID              string
	Namespace       string
	Workflow        string
	WorkflowVersion int
	Status          RunStatus
	Input           json.RawMessage
	// Output is the evaluated workflow output once COMPLETED (JSON).
	Output         json.RawMessage
	Error          *Failure
	Labels         map[string]string
	IdempotencyKey string
	ParentRunID    string
	ParentNodeID   string
	CreateTime     time.Time
	UpdateTime     time.Time
	EndTime        time.Time
	// Nodes is filled by GetRun and WatchRun, empty in ListRuns.
	Nodes []NodeState
	// Priority is the dispatch priority, 1 (lowest) to 5 (highest):
	// StartRun's (WithPriority), or for a child run its parent's.
	Priority int
	// ConcurrencyKey is the value of the workflow's `concurrency.key` for
	// this run's input; empty when the workflow declares no concurrency.
	ConcurrencyKey string
	// Created is set by StartRun: false when an idempotency key matched an
	// existing run.
	Created bool
}

// Node returns the state of the node with this id, or nil.
func (r *Run) Node(id string) *NodeState {
	for i := range r.Nodes {
		if r.Nodes[i].NodeID == id {
			return &r.Nodes[i]
		}
	}
	return nil
}

// DecodeOutput decodes the run's output into out (as encoding/json does).
func (r *Run) DecodeOutput(out any) error {
	if len(r.Output) == 0 {
		return json.Unmarshal([]byte("null"), out)
	}
	return json.Unmarshal(r.Output, out)
}

// WorkflowVersion is one registered, immutable version of a workflow.
type WorkflowVersion struct {
	Namespace   string
	Name        string
	Version     int
	Description string
	Source      string
	ContentHash string
	CreateTime  time.Time
	// Created is set by RegisterWorkflow: false when identical content was
	// already the newest version.
	Created bool
}

// WorkflowSummary is one workflow of a namespace, as ListWorkflows gives it.
type WorkflowSummary struct {
	Namespace string
	Name      string
	// LatestVersion is the highest registered version.
	LatestVersion int
	// Description is the latest version's.
	Description string
	// UpdateTime is when the latest version was registered.
	UpdateTime time.Time
}

// RunCounts is how many runs are in each status (CountRuns).
type RunCounts struct {
	// ByStatus holds the count of each status; a status without runs is
	// absent and reads as 0.
	ByStatus map[RunStatus]int64
	// More is set when the server stopped counting at its limit (100,000
	// matching runs): each count is then a floor, and a status absent may
	// still have runs.
	More bool
}

// Total is the number of runs counted, whatever their status.
func (c RunCounts) Total() int64 {
	var total int64
	for _, n := range c.ByStatus {
		total += n
	}
	return total
}

// ValidationProblem is one problem of a workflow definition.
type ValidationProblem struct {
	// Path of the offending field, e.g. nodes[3].retry.max_attempts.
	Path    string
	Message string
}

// HistoryEvent is one entry of a run's append-only history.
type HistoryEvent struct {
	Sequence  int64
	EventTime time.Time
	// EventType is e.g. TaskCompleted, LeaseExpired, RunCancelled.
	EventType string
	NodeID    string
	Attempt   int
	Actor     string
	Details   json.RawMessage
}

// ServerInfo describes a server.
type ServerInfo struct {
	ServerVersion   string
	ProtocolVersion string
	Features        []string
	// PayloadOffloadBytes: a value whose compact JSON is longer is kept in
	// the blob store and carried as a reference (0: never; docs/payloads.md).
	PayloadOffloadBytes int64
	// MaxPayloadBytes is the largest payload the server accepts, inline or
	// as a blob.
	MaxPayloadBytes int64
	// MaxMessageBytes is the largest request message the server decodes: a
	// larger payload must go through the blob store.
	MaxMessageBytes int64
	// BlobURLs: the server gives presigned URLs (its blob store is a
	// bucket), and UploadBlob and DownloadBlob move the bytes straight to
	// and from the store.
	BlobURLs bool
}

func serverInfoFrom(r *pb.GetServerInfoResponse) *ServerInfo {
	return &ServerInfo{
		ServerVersion: r.GetServerVersion(), ProtocolVersion: r.GetProtocolVersion(), Features: r.GetFeatures(),
		PayloadOffloadBytes: r.GetPayloadOffloadBytes(), MaxPayloadBytes: r.GetMaxPayloadBytes(),
		MaxMessageBytes: r.GetMaxMessageBytes(), BlobURLs: r.GetBlobUrls(),
	}
}

// EventDelivery says where a SendEvent went.
type EventDelivery struct {
	// DeliveredRunIDs are the runs whose waiting node consumed the event now.
	DeliveredRunIDs []string
	// Stored is true when the event was kept for a wait not reached yet.
	Stored bool
}

func toTime(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

func rawJSON(v *structpb.Value) json.RawMessage {
	if v == nil {
		return nil
	}
	if b, ok := appendValueJSON(nil, v, 0); ok {
		return json.RawMessage(b)
	}
	b, err := protojson.Marshal(v)
	if err != nil {
		return nil
	}
	return json.RawMessage(b)
}

// toValue encodes a Go value as a protobuf Value through encoding/json (so
// struct tags and json.Marshaler apply). json.RawMessage is taken as it is.
func toValue(v any) (*structpb.Value, error) {
	var raw []byte
	switch x := v.(type) {
	case nil:
		return structpb.NewNullValue(), nil
	case *structpb.Value:
		return x, nil
	case json.RawMessage:
		raw = x
	default:
		if value, ok := fastValue(v, 0); ok {
			return value, nil
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		raw = b
	}
	if len(raw) == 0 {
		return structpb.NewNullValue(), nil
	}
	out := &structpb.Value{}
	if err := protojson.Unmarshal(raw, out); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	return out, nil
}

func failureFrom(f *pb.Failure) *Failure {
	if f == nil {
		return nil
	}
	return &Failure{Code: f.GetCode(), Message: f.GetMessage(), NodeID: f.GetNodeId(), Details: rawJSON(f.GetDetails())}
}

func runFrom(r *pb.Run) *Run {
	if r == nil {
		return nil
	}
	run := &Run{
		ID: r.GetRunId(), Namespace: r.GetNamespace(), Workflow: r.GetWorkflowName(),
		WorkflowVersion: int(r.GetWorkflowVersion()), Status: RunStatus(r.GetStatus()),
		Input: rawJSON(r.GetInput()), Output: rawJSON(r.GetOutput()), Error: failureFrom(r.GetError()),
		Labels: r.GetLabels(), IdempotencyKey: r.GetIdempotencyKey(), ParentRunID: r.GetParentRunId(),
		ParentNodeID: r.GetParentNodeId(), CreateTime: toTime(r.GetCreateTime()),
		UpdateTime: toTime(r.GetUpdateTime()), EndTime: toTime(r.GetEndTime()),
		Priority: int(r.GetPriority()), ConcurrencyKey: r.GetConcurrencyKey(),
	}
	for _, n := range r.GetNodes() {
		run.Nodes = append(run.Nodes, NodeState{
			NodeID: n.GetNodeId(), NodeType: n.GetNodeType(), Status: NodeStatus(n.GetStatus()),
			Attempt: int(n.GetAttempt()), Output: rawJSON(n.GetOutput()), Error: failureFrom(n.GetError()),
			StartTime: toTime(n.GetStartTime()), EndTime: toTime(n.GetEndTime()),
			Input: rawJSON(n.GetInput()), WorkerID: n.GetWorkerId(), LeaseExpireTime: toTime(n.GetLeaseExpireTime()),
		})
	}
	return run
}

func workflowFrom(w *pb.WorkflowVersion, created bool) *WorkflowVersion {
	return &WorkflowVersion{
		Namespace: w.GetNamespace(), Name: w.GetName(), Version: int(w.GetVersion()),
		Description: w.GetDescription(), Source: w.GetSource(), ContentHash: w.GetContentHash(),
		CreateTime: toTime(w.GetCreateTime()), Created: created,
	}
}

// listedWorkflowFrom is a version as a listing gives it (Created false).
func listedWorkflowFrom(w *pb.WorkflowVersion) *WorkflowVersion { return workflowFrom(w, false) }

func workflowSummaryFrom(w *pb.WorkflowSummary) *WorkflowSummary {
	return &WorkflowSummary{
		Namespace: w.GetNamespace(), Name: w.GetName(), LatestVersion: int(w.GetLatestVersion()),
		Description: w.GetDescription(), UpdateTime: toTime(w.GetUpdateTime()),
	}
}

func historyFrom(e *pb.HistoryEvent) *HistoryEvent {
	return &HistoryEvent{
		Sequence: e.GetSequence(), EventTime: toTime(e.GetEventTime()), EventType: e.GetEventType(),
		NodeID: e.GetNodeId(), Attempt: int(e.GetAttempt()), Actor: e.GetActor(), Details: rawJSON(e.GetDetails()),
	}
}
