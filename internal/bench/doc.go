// Package bench is the benchmark harness behind `holdfast bench`: it runs
// holdfast's locks and the stores' native recipes (etcd's concurrency.Mutex,
// Consul's api.Lock) side by side against the same server, in one run, and
// reports throughput, handoff latency, fairness, store requests per
// acquisition and takeover time after a holder's session dies.
//
// # Model
//
// A Target is a running store (embedded or external) with the implementations
// to compare on it. An Impl makes Contenders; every contender has its own
// client connection and its own session, as separate processes would, and
// counts its own store requests. A contender's Lock returns a Held whose
// Unlock releases the lock. Nothing in-process stands in for the store: the
// only shared state between contenders is the measurement itself.
//
// # Measurements
//
// Contended rows (scenarios lock and handoff) start every contender, let them
// run a warm-up, then measure for a fixed window; only acquisitions whose Lock
// returned inside the window count. Sessions are created before and closed
// after the run, outside the window.
//
//   - acquisitions, acq_per_s: Lock calls that returned a grant in the window.
//   - handoffs, handoffs_per_s: acquisitions where the holder changed (the
//     previous acquisition, in or before the window, was by another contender).
//   - handoff_p50_ms, handoff_p99_ms: on those acquisitions, from the moment
//     the previous holder called Unlock to the moment this holder's Lock
//     returned.
//   - wait_p50_ms, wait_p99_ms: Lock call to Lock return, every acquisition.
//   - cycle_p50_ms: Lock call to Unlock return; reported on rows with one
//     contender only (the uncontended cycle).
//   - fairness: Jain's index over per-contender acquisition counts
//     ((sum x)^2 / (n * sum x^2); 1 is perfectly even, 1/n is one contender
//     taking everything).
//   - rpcs_per_acq: store requests sent by all contenders during the window,
//     divided by acquisitions. etcd: unary gRPC calls counted by a
//     grpc.UnaryClientInterceptor on every contender's client (each retry
//     counts; streams such as Watch and LeaseKeepAlive are not counted, their
//     openings are reported apart as streams_per_acq). Consul: HTTP requests
//     counted by an http.RoundTripper around every contender's api.Client.
//   - violations: times a contender's Lock returned while another contender
//     was still inside its critical section (an atomic "inside" counter
//     decremented just before Unlock is called). Must be 0.
//   - errors: Lock or Unlock failures other than the cancellation that ends a
//     row.
//
// Takeover rows: a holder holds, a waiter waits, and the holder's session is
// destroyed (Consul) or its lease revoked (etcd) from a separate client;
// takeover_ms is from the return of that call to the return of the waiter's
// Lock, notice_ms to the moment the holder is told of its loss. Each setting
// is repeated and the median reported.
package bench
