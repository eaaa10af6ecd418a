#!/bin/bash
sort lines.txt > output.txt
