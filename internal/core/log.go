package core

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/holdfast/holdfast"
)

// LogObserver returns an observer that logs a session's events to l:
// grants (Info), releases and grants ended by Close (Debug), losses with
// their cause (Warn), renewal failures (Warn), and the end of the session
// (Info when closed, Warn when lost). attrs (the store, the session ID) go with every record.
// Nothing secret is logged: names, keys' tokens, and errors, which holdfast
// builds without credentials.
func LogObserver(l *slog.Logger, attrs ...any) holdfast.Observer {
	return logObserver{l.With(attrs...)}
}

type logObserver struct{ l *slog.Logger }

func (o logObserver) Waiting(string, int) {}

func (o logObserver) Acquired(name string, token holdfast.Token, wait time.Duration) {
	o.l.LogAttrs(context.Background(), slog.LevelInfo, "holdfast: granted",
		slog.String("name", name), slog.Uint64("token", uint64(token)), slog.Duration("wait", wait))
}

func (o logObserver) Ended(name string, token holdfast.Token, held time.Duration, cause error) {
	if errors.Is(cause, holdfast.ErrReleased) {
		attrs := []slog.Attr{slog.String("name", name), slog.Uint64("token", uint64(token)), slog.Duration("held", held)}
		if errors.Is(cause, holdfast.ErrSessionClosed) {
			attrs = append(attrs, slog.Any("cause", cause))
		}
		o.l.LogAttrs(context.Background(), slog.LevelDebug, "holdfast: released", attrs...)
		return
	}
	o.l.LogAttrs(context.Background(), slog.LevelWarn, "holdfast: lost",
		slog.String("name", name), slog.Uint64("token", uint64(token)), slog.Duration("held", held), slog.Any("cause", cause))
}

func (o logObserver) RenewalFailed(err error) {
	o.l.LogAttrs(context.Background(), slog.LevelWarn, "holdfast: renewal failed", slog.Any("error", err))
}

func (o logObserver) SessionEnded(cause error) {
	level := slog.LevelWarn
	if errors.Is(cause, holdfast.ErrSessionClosed) {
		level = slog.LevelInfo
	}
	o.l.LogAttrs(context.Background(), level, "holdfast: session ended", slog.Any("cause", cause))
}

// SessionOptions is what the session options both backends share set
// (WithMargin, WithObserver, WithLogger).
type SessionOptions struct {
	Margin    time.Duration
	MarginSet bool // else TTL/5
	Observers []holdfast.Observer
	Logger    *slog.Logger
}

// NewKeeper is NewKeeper with o's margin and observers, the logger's first
// (logging attrs with each event).
func (o SessionOptions) NewKeeper(sent time.Time, ttl time.Duration, attrs ...any) *Keeper {
	k := NewKeeper(sent, ttl, o.Margin)
	if o.Logger != nil {
		k.SetObservers(LogObserver(o.Logger, attrs...))
	}
	k.SetObservers(o.Observers...)
	return k
}
