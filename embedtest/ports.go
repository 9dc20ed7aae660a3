package embedtest

import "github.com/holdfast/holdfast/embedtest/internal/testserver"

// FreePorts returns n distinct loopback TCP ports, below the ephemeral
// range, that were free when probed and that no other server started by
// this process gets: for a server a test starts by other means (a child
// process, say). Another process can still take one before the server
// binds it.
func FreePorts(n int) ([]int, error) { return testserver.FreePorts(n, false) }
