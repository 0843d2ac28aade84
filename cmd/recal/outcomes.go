package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/recal-project/recal/eval/baselines"
	"github.com/recal-project/recal/internal/atomicfile"
	"github.com/recal-project/recal/internal/leakage"
	"github.com/recal-project/recal/internal/outcomes"
	"github.com/recal-project/recal/llmpool"
)

func outcomesCommand() *cli.Command {
	return &cli.Command{
		Name:  "outcomes",
		Usage: "make outcome logs: logged answers of real models that provider \"replay\" answers pool calls from",
		Commands: []*cli.Command{{
			Name:  "convert-evouna",
			Usage: "convert EVOUNA (human-judged answers of five QA systems on NQ and TriviaQA) into an outcome log and question files",
			Description: "Reads NQ.json, TQ.json, LICENSE and README.md from --src and writes into --out: outcomes.jsonl\n" +
				"(one row per record and system with a reply or a judgment), the question files of the complete\n" +
				"questions (<in-domain>/train.jsonl and /test.jsonl, the other dataset's test.jsonl), LICENSE and\n" +
				"README.md with the counts. Prints the counts as JSON. See docs/outcomes.md.",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "src", Usage: "folder holding EVOUNA's NQ.json, TQ.json, LICENSE and README.md"},
				&cli.StringFlag{Name: "out", Usage: "output folder (created; its files are replaced)"},
				&cli.StringFlag{Name: "in-domain", Value: "nq", Usage: "dataset split into training and test questions (nq or triviaqa); the other is test only"},
				&cli.IntFlag{Name: "test", Value: 1000, Usage: "in-domain questions drawn for the test file; the rest are the training file"},
				&cli.Int64Flag{Name: "seed", Value: 0, Usage: "seed of the test draw"},
			},
			Action: func(ctx context.Context, cmd *cli.Command) error {
				if err := requireFlags(cmd, "src", "out"); err != nil {
					return err
				}
				rep, err := outcomes.ConvertEVOUNA(cmd.String("src"), cmd.String("out"),
					outcomes.EVOUNAOptions{InDomain: cmd.String("in-domain"), Test: int(cmd.Int("test")), Seed: cmd.Int64("seed")})
				if err != nil {
					return err
				}
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			},
		}, {
			Name:  "from-collect",
			Usage: "write the outcome matrix of a `recal collect` folder as an outcome log, to replay it",
			Description: "Writes one row per (question, model) with a reply in --dir/outcomes.jsonl to --out: the reply,\n" +
				"its tokens and cost, and correct = exact match of its extracted answer. Failed calls are left out.",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "dir", Usage: "folder made by recal collect --out"},
				&cli.StringFlag{Name: "out", Usage: "outcome log to write (replaced)"},
			},
			Action: func(ctx context.Context, cmd *cli.Command) error {
				if err := requireFlags(cmd, "dir", "out"); err != nil {
					return err
				}
				st, err := baselines.ExportLog(cmd.String("dir"), cmd.String("out"))
				if err != nil {
					return err
				}
				fmt.Printf("%s: %d rows (%d failed calls left out)\n", cmd.String("out"), st.Rows, st.Failed)
				return nil
			},
		}, {
			Name:  "leakage",
			Usage: "measure how much a replayed reply's form tells about its judgment (AUC of a classifier of the reply alone)",
			Description: "Renders every judged row of --log as provider replay would (--render), trains logistic regression on\n" +
				"character 1-4-grams of the reply alone (no question, no model) on some questions, and prints its AUC at\n" +
				"predicting the judgment on the held-out questions (drawn by SHA-256 of the question id): for the rendered\n" +
				"replies, and for the logged reply text where the log has it, overall and per model. 0.5 is chance; a\n" +
				"rendered AUC clearly above the logged text's means the rendering gives the judgment away. --pair A:B\n" +
				"adds how often A's answer occurs in B's reply per pair of judgments, rendered and logged: replies that\n" +
				"agree otherwise than real ones leak to a policy that calls both. See\n" +
				"docs/outcomes.md, \"Leakage\".",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "log", Usage: "outcome log (JSON Lines, .gz allowed)"},
				&cli.StringFlag{Name: "render", Value: llmpool.RenderJudgment, Usage: "render mode to check: judgment or text"},
				&cli.Float64Flag{Name: "test-share", Value: leakage.DefaultTestShare, Usage: "share of questions held out (0 < share < 1)"},
				&cli.StringSliceFlag{Name: "pair", Usage: "A:B: also report how often model A's answer occurs in model B's reply, rendered and logged, per pair of judgments (repeat for more pairs)"},
				&cli.StringFlag{Name: "out", Usage: "also write the report as JSON to this file (replaced atomically)"},
			},
			Action: func(ctx context.Context, cmd *cli.Command) error {
				if err := requireFlags(cmd, "log"); err != nil {
					return err
				}
				if s := cmd.Float64("test-share"); !(s > 0 && s < 1) {
					return usageError{fmt.Errorf("%s: --test-share %v: want a share between 0 and 1", cmd.FullName(), s)}
				}
				var pairs [][2]string
				for _, p := range cmd.StringSlice("pair") {
					a, b, ok := strings.Cut(p, ":")
					if !ok || a == "" || b == "" {
						return usageError{fmt.Errorf("%s: --pair %q: want MODEL_A:MODEL_B", cmd.FullName(), p)}
					}
					pairs = append(pairs, [2]string{a, b})
				}
				rep, err := leakage.CheckFile(cmd.String("log"), cmd.String("render"), leakage.Options{TestShare: cmd.Float64("test-share")}, pairs)
				if err != nil {
					return err
				}
				if out := cmd.String("out"); out != "" {
					if err := atomicfile.Write(out, func(w io.Writer) error {
						enc := json.NewEncoder(w)
						enc.SetIndent("", "  ")
						return enc.Encode(rep)
					}); err != nil {
						return err
					}
				}
				return rep.Format(os.Stdout)
			},
		}},
	}
}
