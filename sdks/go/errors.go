package composer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ReasonLeaseLost is the google.rpc.ErrorInfo reason of a Heartbeat or a
// report made with a stale lease (code FAILED_PRECONDITION).
const ReasonLeaseLost = "LEASE_LOST"

// The google.rpc.ErrorInfo reasons of a RESOURCE_EXHAUSTED that says the
// server is busy rather than the request too large: the same call succeeds
// later, after the Error's RetryAfter.
const (
	// ReasonQuotaExceeded: a quota of the namespace or the token is used up
	// for now (google.rpc.QuotaFailure names it).
	ReasonQuotaExceeded = "QUOTA_EXCEEDED"
	// ReasonCPUPoolBusy: the server's threads for CPU-heavy checks of
	// requests are all taken.
	ReasonCPUPoolBusy = "CPU_POOL_BUSY"
)

// FieldViolation is one problem with one field of a request, from the
// google.rpc.BadRequest detail of an INVALID_ARGUMENT status.
type FieldViolation struct {
	// Field is the path of the offending field, e.g. nodes[3].retry.max_attempts.
	Field string
	// Description says what is wrong with it.
	Description string
	// Reason is a machine-readable reason, when the server gives one.
	Reason string
}

func (v FieldViolation) String() string {
	if v.Field == "" {
		return v.Description
	}
	return v.Field + ": " + v.Description
}

// Error is a failed call to the Composer server: every error the Client and
// the Worker return for an RPC is (or wraps) an *Error. Use errors.As to read
// it, or the IsNotFound, IsLeaseLost, ... helpers.
//
// Code is the gRPC status code and Message the server's message;
// FieldViolations (google.rpc.BadRequest), Reason, Domain and Metadata
// (google.rpc.ErrorInfo) and RetryAfter (google.rpc.RetryInfo) come from the
// status details when the server sent them. An *Error also implements
// GRPCStatus, so status.Code(err) works.
type Error struct {
	Code            codes.Code
	Message         string
	FieldViolations []FieldViolation
	Reason          string
	Domain          string
	Metadata        map[string]string
	// RetryAfter is how long the server asks to wait before trying again
	// (0 when it did not say).
	RetryAfter time.Duration

	status *status.Status
}

// Error renders the code, the message, the reason and one line per field
// violation.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(codeName(e.Code))
	b.WriteString(": ")
	b.WriteString(e.Message)
	if e.Reason != "" {
		fmt.Fprintf(&b, " [%s]", e.Reason)
	}
	for _, v := range e.FieldViolations {
		b.WriteString("\n  - ")
		b.WriteString(v.String())
	}
	return b.String()
}

// GRPCStatus returns the gRPC status the error was made from.
func (e *Error) GRPCStatus() *status.Status {
	if e.status != nil {
		return e.status
	}
	return status.New(e.Code, e.Message)
}

// Retryable reports whether the same call may be retried as it is
// (UNAVAILABLE or DEADLINE_EXCEEDED: the server was unreachable or slow).
func (e *Error) Retryable() bool {
	return e.Code == codes.Unavailable || e.Code == codes.DeadlineExceeded
}

// LeaseLost reports whether the server refused a heartbeat or a report
// because the task's lease is no longer this worker's.
func (e *Error) LeaseLost() bool {
	return e.Code == codes.FailedPrecondition && e.Reason == ReasonLeaseLost
}

// codeName is the canonical upper-case name of a code (INVALID_ARGUMENT).
func codeName(c codes.Code) string {
	switch c {
	case codes.OK:
		return "OK"
	case codes.Canceled:
		return "CANCELLED"
	case codes.Unknown:
		return "UNKNOWN"
	case codes.InvalidArgument:
		return "INVALID_ARGUMENT"
	case codes.DeadlineExceeded:
		return "DEADLINE_EXCEEDED"
	case codes.NotFound:
		return "NOT_FOUND"
	case codes.AlreadyExists:
		return "ALREADY_EXISTS"
	case codes.PermissionDenied:
		return "PERMISSION_DENIED"
	case codes.ResourceExhausted:
		return "RESOURCE_EXHAUSTED"
	case codes.FailedPrecondition:
		return "FAILED_PRECONDITION"
	case codes.Aborted:
		return "ABORTED"
	case codes.OutOfRange:
		return "OUT_OF_RANGE"
	case codes.Unimplemented:
		return "UNIMPLEMENTED"
	case codes.Internal:
		return "INTERNAL"
	case codes.Unavailable:
		return "UNAVAILABLE"
	case codes.DataLoss:
		return "DATA_LOSS"
	case codes.Unauthenticated:
		return "UNAUTHENTICATED"
	}
	return c.String()
}

// FromStatus converts a gRPC status into an *Error, decoding its
// google.rpc.BadRequest, google.rpc.ErrorInfo and google.rpc.RetryInfo
// details.
func FromStatus(st *status.Status) *Error {
	e := &Error{Code: st.Code(), Message: st.Message(), status: st}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				e.FieldViolations = append(e.FieldViolations, FieldViolation{Field: v.GetField(), Description: v.GetDescription(), Reason: v.GetReason()})
			}
		case *errdetails.ErrorInfo:
			e.Reason, e.Domain, e.Metadata = d.GetReason(), d.GetDomain(), d.GetMetadata()
		case *errdetails.RetryInfo:
			e.RetryAfter = d.GetRetryDelay().AsDuration()
		}
	}
	return e
}

// convertError turns an error returned by a gRPC call into an *Error; nil
// stays nil, and an error that is not a status (rare) is kept as it is.
func convertError(err error) error {
	if err == nil {
		return nil
	}
	var ce *Error
	if errors.As(err, &ce) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	return FromStatus(st)
}

// invalidArgument is a bad argument caught before any call, shaped as the
// server's answer to it (INVALID_ARGUMENT with one violation naming the
// request field), so a caller handles both alike.
func invalidArgument(field, description string) *Error {
	return &Error{
		Code: codes.InvalidArgument, Message: field + ": " + description,
		FieldViolations: []FieldViolation{{Field: field, Description: description}},
	}
}

// AsError returns the *Error in err's chain, if any.
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

// Code returns the gRPC code of the *Error in err's chain: codes.OK for nil,
// codes.Unknown for an error that is not a Composer error.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	if e, ok := AsError(err); ok {
		return e.Code
	}
	return codes.Unknown
}

func hasCode(err error, c codes.Code) bool {
	e, ok := AsError(err)
	return ok && e.Code == c
}

// IsInvalidArgument: the request (a workflow definition, a run's input) is
// invalid; the *Error's FieldViolations list each problem.
func IsInvalidArgument(err error) bool { return hasCode(err, codes.InvalidArgument) }

// IsNotFound: the workflow, version or run does not exist in the caller's namespace.
func IsNotFound(err error) bool { return hasCode(err, codes.NotFound) }

// IsAlreadyExists: ALREADY_EXISTS.
func IsAlreadyExists(err error) bool { return hasCode(err, codes.AlreadyExists) }

// IsFailedPrecondition: the call does not fit the object's state (cancelling
// a finished run, retrying a run that did not fail, a stale lease).
func IsFailedPrecondition(err error) bool { return hasCode(err, codes.FailedPrecondition) }

// IsLeaseLost: FAILED_PRECONDITION with reason LEASE_LOST: the task's lease
// is no longer this worker's. Never retry such a call.
func IsLeaseLost(err error) bool {
	e, ok := AsError(err)
	return ok && e.LeaseLost()
}

// IsResourceExhausted: a payload exceeds the server's limit, or a quota is used up.
func IsResourceExhausted(err error) bool { return hasCode(err, codes.ResourceExhausted) }

// isBusy: RESOURCE_EXHAUSTED because the server is busy (a quota used up
// for now, the CPU pool full), not because the request is too large; the
// same call may be sent again after the error's RetryAfter.
func isBusy(err error) bool {
	e, ok := AsError(err)
	return ok && e.Code == codes.ResourceExhausted && (e.Reason == ReasonQuotaExceeded || e.Reason == ReasonCPUPoolBusy)
}

// IsPermissionDenied: the token's role or queues do not allow the call.
func IsPermissionDenied(err error) bool { return hasCode(err, codes.PermissionDenied) }

// IsUnauthenticated: no token, or an invalid one.
func IsUnauthenticated(err error) bool { return hasCode(err, codes.Unauthenticated) }

// IsUnavailable: the server could not be reached (transient).
func IsUnavailable(err error) bool { return hasCode(err, codes.Unavailable) }

// IsUnimplemented: the server does not have this RPC.
func IsUnimplemented(err error) bool { return hasCode(err, codes.Unimplemented) }

// IsRetryable: the call failed with UNAVAILABLE or DEADLINE_EXCEEDED and may
// be sent again as it is.
func IsRetryable(err error) bool {
	e, ok := AsError(err)
	return ok && e.Retryable()
}

// RunFailedError is returned by WaitForResult and RunWorkflow when the run
// ended FAILED or CANCELLED. Run is the final run; its Error says why (for
// a cancelled run, code CANCELLED and the cancel's reason as message).
type RunFailedError struct {
	Run *Run
}

// Code is the run's failure code: its Error's, else CANCELLED for a
// cancelled run, else "".
func (e *RunFailedError) Code() string {
	if f := e.Run.Error; f != nil && f.Code != "" {
		return f.Code
	}
	if e.Run.Status == RunCancelled {
		return "CANCELLED"
	}
	return ""
}

// Message is the failure's message: for a cancelled run, the reason given
// to the cancel ("" when none was).
func (e *RunFailedError) Message() string {
	if f := e.Run.Error; f != nil {
		return f.Message
	}
	return ""
}

func (e *RunFailedError) Error() string {
	why := "no error recorded"
	if code := e.Code(); code != "" {
		why = code
		if msg := e.Message(); msg != "" {
			why += ": " + msg
		}
		if f := e.Run.Error; f != nil && f.NodeID != "" {
			why += " (node " + f.NodeID + ")"
		}
	}
	return fmt.Sprintf("run %s ended %s: %s", e.Run.ID, e.Run.Status, why)
}

// IsRunFailed reports whether err says a waited-for run ended FAILED or CANCELLED.
func IsRunFailed(err error) bool {
	var e *RunFailedError
	return errors.As(err, &e)
}

// TaskError is what a handler returns to fail its attempt with a chosen
// code, retryability and details. Code is matched against the node's
// retry.non_retryable list and is readable by error edges as
// nodes.<id>.error.code.
//
// Retryable is false in the zero value: a TaskError fails the node at once
// unless Retryable is set. Any error that is not a TaskError is a retryable
// failure (see Worker).
type TaskError struct {
	// Code is a short machine-readable code (TASK_ERROR when empty).
	Code string
	// Message is the human-readable message (the wrapped error's text when empty).
	Message string
	// Retryable lets the node's retry policy run another attempt.
	Retryable bool
	// Details are optional structured details (JSON-encodable).
	Details any
	// Err is an optional underlying error, reachable with errors.Is / As.
	Err error
}

func (e *TaskError) Error() string {
	msg := e.Message
	if msg == "" && e.Err != nil {
		msg = e.Err.Error()
	}
	return e.code() + ": " + msg
}

// Unwrap returns the underlying error.
func (e *TaskError) Unwrap() error { return e.Err }

func (e *TaskError) code() string {
	if e.Code == "" {
		return "TASK_ERROR"
	}
	return e.Code
}

func (e *TaskError) message() string {
	if e.Message != "" {
		return e.Message
	}
	if e.Err != nil {
		return e.Err.Error()
	}
	return e.code()
}

// NonRetryable marks err as a final failure: the node fails at once,
// whatever its retry policy says. A *TaskError in err's chain keeps its code
// and details; any other error gets the code NON_RETRYABLE.
func NonRetryable(err error) error {
	if err == nil {
		return nil
	}
	var te *TaskError
	if errors.As(err, &te) {
		c := *te
		c.Retryable = false
		if c.Message == "" {
			c.Message = err.Error()
		}
		if c.Err == nil {
			c.Err = err
		}
		return &c
	}
	return &TaskError{Code: "NON_RETRYABLE", Message: err.Error(), Err: err}
}

// RunCancelledError is the cause (context.Cause) of a handler's ctx when a
// heartbeat answered that the task's run was cancelled: errors.Is(err,
// ErrRunCancelled) holds, and Reason is why (CancelRun's reason, or the
// server's own, e.g. a run timeout; empty when none was given). Nothing is
// reported for the attempt.
type RunCancelledError struct {
	Reason string
}

// Error is "run cancelled: <reason>", or "run cancelled" without one.
func (e *RunCancelledError) Error() string {
	if e.Reason == "" {
		return ErrRunCancelled.Error()
	}
	return ErrRunCancelled.Error() + ": " + e.Reason
}

// Is makes errors.Is(err, ErrRunCancelled) hold.
func (e *RunCancelledError) Is(target error) bool { return target == ErrRunCancelled }

// CancelReason returns why the task's run was cancelled (CancelRun's reason,
// or the server's own) once a handler's ctx was cancelled for that; ""
// while ctx is live, when it ended for another cause (context.Cause tells
// which), or when the cancel gave no reason.
func CancelReason(ctx context.Context) string {
	var rc *RunCancelledError
	if errors.As(context.Cause(ctx), &rc) {
		return rc.Reason
	}
	return ""
}

// Causes given to a handler's context (read them with context.Cause).
var (
	// ErrRunCancelled: a heartbeat answered that the task's run was
	// cancelled. The cause is a *RunCancelledError carrying the reason
	// (errors.Is(cause, ErrRunCancelled) holds; CancelReason reads it).
	// Nothing is reported for the attempt.
	ErrRunCancelled = errors.New("run cancelled")
	// ErrLeaseLost: the server said the task's lease is no longer this
	// worker's. Nothing is reported for the attempt.
	ErrLeaseLost = errors.New("lease lost")
	// ErrWorkerShutdown: the worker stopped and the attempt did not finish
	// within the drain; it was failed as WORKER_SHUTDOWN (retryable).
	ErrWorkerShutdown = errors.New("worker shutdown")
	// ErrAttemptTimeout: the attempt's deadline (the node's timeout) passed.
	ErrAttemptTimeout = errors.New("attempt deadline exceeded")
)
