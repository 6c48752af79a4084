package composer

import (
	"context"
	"log/slog"
)

// taskHandler is the handler of a Task's Logger: the worker's handler with
// the task's ids as attributes, as Logger.With would make it, except that
// the attributes are only attached to records that are actually written.
// Logger.With asks the handler to format them at once (slog's built-in
// handlers do), which costs every task an allocation-heavy pass even when
// it logs nothing. The first WithAttrs or WithGroup on it makes the real
// handler, so what a handler derived from it writes does not change.
type taskHandler struct {
	base  slog.Handler
	attrs []slog.Attr
}

func taskLogger(base *slog.Logger, attrs ...slog.Attr) *slog.Logger {
	return slog.New(&taskHandler{base: base.Handler(), attrs: attrs})
}

func (h *taskHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.base.Enabled(ctx, level)
}

func (h *taskHandler) Handle(ctx context.Context, r slog.Record) error {
	// The task's attributes come first, as they would from WithAttrs.
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	out.AddAttrs(h.attrs...)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(a)
		return true
	})
	return h.base.Handle(ctx, out)
}

func (h *taskHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return h.base.WithAttrs(h.attrs).WithAttrs(attrs)
}

func (h *taskHandler) WithGroup(name string) slog.Handler {
	return h.base.WithAttrs(h.attrs).WithGroup(name)
}
