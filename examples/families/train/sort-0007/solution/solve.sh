#!/bin/bash
sort lines.txt > summary.txt
