// Package core holds the parts every holdfast backend shares: the safe local
// deadline of a session (Keeper), in-process exclusion per lock name
// (Names), and the grant bookkeeping (Grant) with reentrancy and
// cancel-on-loss. Backends add the store protocol around them.
package core
