package numa_test

import (
	"fmt"

	"github.com/shardload/shardload/numa"
)

func ExampleTopology_Place() {
	// "/" reads this machine; here a copy of a two-socket server's sysfs.
	topo, err := numa.Read("testdata/two-socket-8gpu")
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, gpu := range []int{1, 4} {
		plan, err := topo.Place(gpu)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(plan.Reason)
		// A worker would now call numa.LockThread(plan.CPUs), or the process
		// numa.SetProcessAffinity(plan.CPUs), and bind its buffers with
		// numa.Bind(mem, plan.Node) when plan.Placed().
	}
	// Output:
	// GPU 1 (0000:2a:00.0) is on node 0: threads on its CPUs 0-23,48-71, memory bound to node 0
	// GPU 4 (0000:9a:00.0) is on node 1: threads on its CPUs 24-47,72-95, memory bound to node 1
}

func ExampleParseCPUList() {
	cpus, err := numa.ParseCPUList("0-3,8-11")
	fmt.Println(cpus, err, numa.FormatCPUList(cpus))
	// Output: [0 1 2 3 8 9 10 11] <nil> 0-3,8-11
}
