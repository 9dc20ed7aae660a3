package conformance

// PropertyCounts returns the number of the suite's lock properties (those
// every backend runs) and of all its properties, for the test that keeps
// the docs' counts in step.
func PropertyCounts() (lock, all int) {
	for _, st := range subtests {
		if st.needs == "" {
			lock++
		}
	}
	return lock, len(subtests)
}

// PropertyNames returns the names of the suite's properties, in the order
// Run runs them.
func PropertyNames() []string {
	var names []string
	for _, st := range subtests {
		names = append(names, st.name)
	}
	return names
}
