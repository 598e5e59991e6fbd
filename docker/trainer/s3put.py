"""Uploads the files of a directory to an S3-compatible store (MinIO), making the
bucket first: the compose demo's upload step, with nothing but Python's standard
library (the trainer image has no S3 client). Requests are signed with AWS
Signature Version 4 from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY, with path-style addressing as MinIO wants.

    s3put.py DIR s3://BUCKET/PREFIX/

Prints one line: the files and bytes uploaded. Exit status 1 on any refused request.
"""

import datetime
import hashlib
import hmac
import http.client
import os
import sys
import urllib.parse


def sign(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def request(method, path, body=b""):
    """One signed request to the endpoint; returns (status, response body)."""
    endpoint = urllib.parse.urlsplit(os.environ["AWS_ENDPOINT_URL"])
    region = os.environ.get("AWS_REGION", "us-east-1")
    access, secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
    now = datetime.datetime.now(datetime.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload = hashlib.sha256(body).hexdigest()
    uri = urllib.parse.quote(path, safe="/-_.~")
    headers = {"host": endpoint.netloc, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
    signed = ";".join(sorted(headers))
    canonical = "\n".join([method, uri, "", "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)), signed, payload])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    k = sign(sign(sign(sign(("AWS4" + secret).encode(), day), region), "s3"), "aws4_request")
    signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={access}/{scope}, SignedHeaders={signed}, "
                                f"Signature={signature}")
    conn_class = http.client.HTTPSConnection if endpoint.scheme == "https" else http.client.HTTPConnection
    conn = conn_class(endpoint.netloc, timeout=60)
    try:
        conn.request(method, uri, body=body, headers={k: v for k, v in headers.items() if k != "host"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def main():
    if len(sys.argv) != 3 or not sys.argv[2].startswith("s3://"):
        sys.exit("usage: s3put.py DIR s3://BUCKET/PREFIX/")
    src = sys.argv[1]
    bucket, _, prefix = sys.argv[2][len("s3://"):].partition("/")
    status, body = request("PUT", f"/{bucket}")
    if status not in (200, 409):  # 409: the bucket exists (ours)
        sys.exit(f"s3put: making bucket {bucket}: HTTP {status}: {body[:300]!r}")
    files = total = 0
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        status, body = request("PUT", f"/{bucket}/{prefix}{name}", data)
        if status != 200:
            sys.exit(f"s3put: {name}: HTTP {status}: {body[:300]!r}")
        files, total = files + 1, total + len(data)
    if files == 0:
        sys.exit(f"s3put: no files in {src}")
    print(f"s3put: {files} files, {total} bytes to s3://{bucket}/{prefix}")


if __name__ == "__main__":
    main()
