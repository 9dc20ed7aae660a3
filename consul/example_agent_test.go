package consul_test

import (
	"log"

	"github.com/holdfast/holdfast/embedtest"
)

// forExamplesRunAgainstAnAgent runs an example's body against a real
// `consul agent -dev` started for it and stopped after it; addr is the
// agent's HTTP address, where your code has yours ("" for
// $CONSUL_HTTP_ADDR, else 127.0.0.1:8500). The body is the code a user
// writes.
func forExamplesRunAgainstAnAgent(example func(addr string)) {
	agent, err := embedtest.StartConsul()
	if err != nil {
		log.Fatal(err)
	}
	defer agent.Close()
	example(agent.HTTPAddr)
}
