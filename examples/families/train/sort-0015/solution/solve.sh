#!/bin/bash
sort input.txt > result.txt
