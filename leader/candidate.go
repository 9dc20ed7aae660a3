package leader

import (
	"context"

	"github.com/holdfast/holdfast"
)

// Candidate is one backend's election on one name, as *etcd.Election and
// *consul.Election implement it: G is the backend's grant type, so the
// leader's callbacks get guarded writes without a type assertion.
type Candidate[G holdfast.Grant] interface {
	// Name returns the election's name.
	Name() string
	// Campaign waits until this candidate is the leader, publishing value,
	// and returns the leadership grant: its Token is the term, its
	// Context is cancelled when leadership is lost (before another
	// candidate can win), and its Unlock resigns. It returns within
	// milliseconds of ctx or the session ending, leaving nothing behind.
	Campaign(ctx context.Context, value []byte) (G, error)
	// Leader returns the current leader, or an error wrapping
	// holdfast.ErrNoLeader if there is none.
	Leader(ctx context.Context) (holdfast.Leader, error)
	// Observe delivers the current leader (or the zero Leader for "no
	// leader") and then every change, in order of terms, until ctx or the
	// session ends; then the channel is closed. A candidate is reported
	// once it leads: its Campaign has returned, or would have but for its
	// ctx ending while the store was making it leader.
	Observe(ctx context.Context) <-chan holdfast.Leader
}
