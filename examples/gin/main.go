// Command gin is the middleware example for a gin router: the same
// in-process Sluice node, adapted by the ginlimit package.
//
//	SLUICE_NODE_TOKEN=... go run ./examples/gin
package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/enforcer/middleware"
	"github.com/sluicehq/sluice/enforcer/middleware/ginlimit"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	node, err := middleware.NewNode(middleware.NodeConfig{
		ConsoleURL: cmp.Or(os.Getenv("SLUICE_CONSOLE_URL"), "http://127.0.0.1:8080"),
		NodeToken:  os.Getenv("SLUICE_NODE_TOKEN"),
		NodeID:     "example-gin",
		RedisURL:   cmp.Or(os.Getenv("REDIS_URL"), "redis://127.0.0.1:6379/0"),
	})
	if err != nil {
		return err
	}
	defer node.Close()
	go node.Run(ctx)

	limit, err := node.Limiter(middleware.Config{Domain: "app"}) // by client address
	if err != nil {
		return err
	}
	r := gin.New()
	r.Use(gin.Recovery(), ginlimit.Handler(limit))
	r.GET("/hello", func(c *gin.Context) { c.String(200, "hello\n") })
	return r.Run(cmp.Or(os.Getenv("LISTEN"), ":8091"))
}
