"""Unit tests of the pure helpers of the installed `warmpath_router` package
(run by test_wheel.py with the fresh venv's Python; standalone:
`PYTHONPATH=python python3 -m unittest discover -s python/tests -p 'test_helpers.py'`)."""

import json
import unittest

from warmpath_router.client import sse_data
from warmpath_router.vllm import agent_flags, local_endpoint, parse_vllm

KV = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
                 "replay_endpoint": "tcp://*:5558", "topic": "kv-events"})


def flag(args, name):
    return args[args.index(name) + 1]


class VllmFlags(unittest.TestCase):
    def test_the_readme_command_line(self):
        v = parse_vllm(["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8001",
                        "--enable-prompt-tokens-details", "--kv-events-config", KV])
        args, notes = agent_flags(v, worker_id="http://10.0.0.5:8001", routers=["http://r:50051"])
        self.assertEqual(flag(args, "--model"), "meta-llama/Llama-3.1-8B-Instruct")
        self.assertEqual(flag(args, "--engine-url"), "http://127.0.0.1:8001")
        self.assertEqual(flag(args, "--kv-events"), "tcp://127.0.0.1:5557")
        self.assertEqual(flag(args, "--kv-replay"), "tcp://127.0.0.1:5558")
        self.assertEqual(flag(args, "--topic"), "kv-events")
        self.assertEqual(flag(args, "--worker-id"), "http://10.0.0.5:8001")
        self.assertEqual(flag(args, "--router"), "http://r:50051")
        self.assertNotIn("--mode", args)
        self.assertTrue(any("block_size: 16" in n for n in notes), notes)

    def test_served_name_dotted_config_dp_and_k8s(self):
        v = parse_vllm(["serve", "/models/x", "--served-model-name", "x-chat", "alias", "--block-size=32",
                        "--kv-events-config.enable_kv_cache_events", "true",
                        "--kv-events-config.endpoint=tcp://0.0.0.0:6000", "-dp", "2"])
        args, notes = agent_flags(v, k8s=True)
        self.assertEqual(flag(args, "--model"), "x-chat")
        self.assertEqual(flag(args, "--kv-events"), "tcp://127.0.0.1:6000")
        self.assertEqual(flag(args, "--dp-ranks"), "2")
        self.assertEqual(flag(args, "--worker-id-from-env"), "POD_IP")
        self.assertEqual(flag(args, "--worker-id-template"), "http://{}:8000")
        self.assertNotIn("--kv-replay", args)
        self.assertTrue(any("block_size: 32" in n for n in notes), notes)
        self.assertTrue(any("replay" in n for n in notes), notes)

    def test_events_off_says_to_turn_them_on(self):
        for extra in ([], ["--kv-events-config", '{"enable_kv_cache_events": true, "publisher": "null"}']):
            args, notes = agent_flags(parse_vllm(["vllm", "serve", "m"] + extra), worker_id="w")
            self.assertEqual(flag(args, "--kv-events"), "tcp://127.0.0.1:5557")
            self.assertEqual(flag(args, "--kv-replay"), "tcp://127.0.0.1:5558")
            self.assertNotIn("--mode", args)
            hint = [n for n in notes if "start vLLM with --kv-events-config" in n]
            self.assertEqual(len(hint), 1, notes)
            self.assertIn('"enable_kv_cache_events": true', hint[0])

    def test_a_connecting_endpoint_is_flagged(self):
        ep, note = local_endpoint("tcp://10.1.2.3:5557")
        self.assertEqual(ep, "tcp://10.1.2.3:5557")
        self.assertIn("connects instead of binding", note)
        self.assertEqual(local_endpoint("tcp://[::]:5557"), ("tcp://127.0.0.1:5557", None))
        self.assertEqual(local_endpoint("ipc:///tmp/kv"), ("ipc:///tmp/kv", None))

    def test_no_model_or_bad_json_is_an_error(self):
        with self.assertRaises(ValueError):
            parse_vllm(["vllm", "serve", "--port", "8000"])
        with self.assertRaises(ValueError):
            parse_vllm(["vllm", "serve", "m", "--kv-events-config", "{nope"])


class Sse(unittest.TestCase):
    def test_events_comments_and_multiline_data(self):
        lines = [b": keep-alive\n", b"data: {\"a\": 1}\n", b"\n", b"data:x\r\n", b"data: y\r\n", b"\r\n",
                 b"event: ignored\n", b"data: [DONE]\n", b"\n"]
        self.assertEqual(list(sse_data(lines)), ['{"a": 1}', "x\ny", "[DONE]"])

    def test_a_last_event_without_blank_line(self):
        self.assertEqual(list(sse_data([b"data: tail"])), ["tail"])


if __name__ == "__main__":
    unittest.main()
