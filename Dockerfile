# One image for every Lightpath process (api, worker, mock-oxc, migrate, serve).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /srv/lightpath
COPY pyproject.toml README.md ./
COPY app ./app
COPY lightpath_client ./lightpath_client
COPY migrations ./migrations
COPY data ./data
# byte-compiled once here: PYTHONDONTWRITEBYTECODE keeps the (editable) sources from
# being cached at run time, so every start would compile app/ again (~0.35 s)
RUN pip install -e '.[server]' && python -m compileall -q app lightpath_client migrations \
    && useradd --system --uid 10001 lightpath && mkdir -p /data && chown lightpath /data
USER lightpath
WORKDIR /data
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8080/healthz')" || exit 1
ENTRYPOINT ["lightpath"]
CMD ["serve", "--host", "127.0.0.1", "--port", "8080"]
