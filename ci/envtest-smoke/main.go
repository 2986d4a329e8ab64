// Command envtest-smoke is the smallest user of controller-runtime's envtest: it starts the
// control plane KUBEBUILDER_ASSETS names (`harness assets`), writes and reads one object through
// it, and stops it, so a Go project can see the harness's binaries serve its own envtest suites.
// Run by `ci/upstream_suites.sh envtest`.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

func fail(step string, err error) {
	fmt.Fprintf(os.Stderr, "envtest-smoke: %s: %v\n", step, err)
	os.Exit(1)
}

func main() {
	began := time.Now()
	env := &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		fail("start", err)
	}
	started := time.Since(began)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		fail("client", err)
	}
	written := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "envtest-smoke", Namespace: "default"},
		Data:       map[string]string{"written": "by envtest-smoke"},
	}
	if err := c.Create(ctx, written); err != nil {
		fail("create", err)
	}
	var read corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKeyFromObject(written), &read); err != nil {
		fail("get", err)
	}
	if read.Data["written"] != "by envtest-smoke" {
		fail("get", fmt.Errorf("read back %v", read.Data))
	}
	if err := env.Stop(); err != nil {
		fail("stop", err)
	}
	fmt.Printf("envtest-smoke: started in %.1f s, wrote and read a ConfigMap, stopped in %.1f s in all\n",
		started.Seconds(), time.Since(began).Seconds())
}
