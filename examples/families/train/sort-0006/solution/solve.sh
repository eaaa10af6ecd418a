#!/bin/bash
sort input.txt > out.txt
